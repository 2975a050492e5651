#!/usr/bin/env bash
# Request truncation (issue 40: top-k / top-p / min-p) on the GPU, logs under $OUT, the
# benches' table rows under $OUT/results (append them with
# `python benchmarks/record.py append <that folder>`):
#   bash scripts/gpu_truncation.sh tests     # the truncation tests on CUDA (ops, vLLM ports, generate, eval),
#                                            # then the 10^6-trial lossless cases (SPECDRAFT_SLOW=1, -m slow)
#   bash scripts/gpu_truncation.sh bench     # benchmarks/bench_truncation.py --tiles (the cut, its tiles, the truncated samplers)
#                                            # and bench_truncation_acceptance.py on the demo pair
#   OLD_SRC=DIR OLD_COMMIT=SHA bash scripts/gpu_truncation.sh side
#                                            # bench_truncation.py --no-baselines on an older tree's package
#                                            # (DIR holds its specdraft/, e.g. `git archive SHA src/specdraft`
#                                            # without assets), then on this one: ratios side by side in one call.
#                                            # DIR must travel to the device: untracked and not ignored, or named
#                                            # in the device call's carry (an ignored DIR left behind benches this
#                                            # tree twice, silently)
#   OLD_SRC=DIR SWEEP="COLLECT_WARPS=8 KEYED_FROM=256,512" bash scripts/gpu_truncation.sh profile
#                                            # scripts/profile_truncation.py: each kernel's time on an older
#                                            # tree's package (OLD_SRC, optional), then on this one with SWEEP
#   bash scripts/gpu_truncation.sh sanitize  # compute-sanitizer memcheck over the three kernels that take a cut
#   bash scripts/gpu_truncation.sh all       # the three in turn (about 9 minutes on one H200)
DEFAULT_OUT=/tmp/gpu_truncation
source "$(dirname "$0")/gpu_setup.sh"
stage=${1:-tests}
tests() {
    shopt -s nullglob
    files=(tests/ops/sampling/test_truncat*.py tests/ops/sampling/test_vllm_*.py tests/ops/sampling/test_tree_verify*.py
           tests/ops/sampling/test_rejection.py tests/ops/sampling/test_draft.py tests/generation/test_truncated_generate.py
           tests/test_eval.py tests/training/test_evaluate.py)
    shopt -u nullglob
    echo "test files: ${files[*]}"
    SPECDRAFT_DEVICE=cuda timeout 240 python3 -m pytest -q -n 12 -p no:cacheprovider -m "not interpreter" -rfEs \
        "${files[@]}" > "$OUT/tests_truncation.log" 2>&1
    echo "truncation tests: exit $?"; tail -12 "$OUT/tests_truncation.log"
    # Six workers: a 10^6-trial case holds ~10 GB of the GPU (12 workers ran out of an H200's 140 GB).
    SPECDRAFT_SLOW=1 SPECDRAFT_DEVICE=cuda timeout 240 python3 -m pytest -q -n 6 -p no:cacheprovider -m slow -rfEs \
        tests/ops/sampling/test_truncated_sampling_lossless.py > "$OUT/tests_truncation_slow.log" 2>&1
    echo "10^6-trial lossless cases: exit $?"; tail -6 "$OUT/tests_truncation_slow.log"
}
bench() {
    timeout 300 python3 benchmarks/bench_truncation.py --tiles > "$OUT/bench_truncation.log" 2>&1
    echo "bench_truncation: exit $?"; grep "^|" "$OUT/bench_truncation.log"
    if [ -f benchmarks/bench_truncation_acceptance.py ]; then
        timeout 150 python3 benchmarks/bench_truncation_acceptance.py --device cuda > "$OUT/bench_truncation_acceptance.log" 2>&1
        echo "bench_truncation_acceptance: exit $?"; tail -12 "$OUT/bench_truncation_acceptance.log"
    fi
}
side() {
    PYTHONPATH="$OLD_SRC" BENCH_COMMIT="$OLD_COMMIT" timeout 200 python3 benchmarks/bench_truncation.py --no-baselines \
        > "$OUT/bench_truncation_old.log" 2>&1
    echo "bench_truncation at $OLD_COMMIT: exit $?"; grep "^|" "$OUT/bench_truncation_old.log"
    timeout 200 python3 benchmarks/bench_truncation.py --no-baselines > "$OUT/bench_truncation.log" 2>&1
    echo "bench_truncation: exit $?"; grep "^|" "$OUT/bench_truncation.log"
}
profile() {
    if [ -n "${OLD_SRC:-}" ]; then
        PYTHONPATH="$OLD_SRC" timeout 120 python3 scripts/profile_truncation.py > "$OUT/profile_old.log" 2>&1
        echo "profile of $OLD_SRC: exit $?"; grep "^T = " "$OUT/profile_old.log"
    fi
    # shellcheck disable=SC2086  # SWEEP is a list of NAME=v1,v2 words
    timeout 300 python3 scripts/profile_truncation.py ${SWEEP:-} > "$OUT/profile.log" 2>&1
    echo "profile: exit $?"; grep -E "^T = |=" "$OUT/profile.log" | grep -v -i warn
}
sanitize() {
    # Small odd sizes (rows and vocabulary not multiples of any tile), every rule mixed in one batch.
    cat > "$OUT/sanitize_truncation.py" <<'PY'
import torch
from specdraft.ops import draft_sample, rejection_sample, truncation_cut
B, K, V = 9, 3, 3001
g = torch.Generator(device="cuda").manual_seed(0)
logits = (torch.randn(B * (K + 1), V, device="cuda", generator=g) * 3).to(torch.bfloat16)
# Rows: greedy, maxima.py's (top-k; min-p alone), split.py's (top-p alone, keyed in
# bf16; k above maxima.py's bound), kernel.py's (min-p, k above that bound).
temp = torch.tensor([0.0, 0.5, 0.7, 1.0, 2.0, 1.0, 0.7, 1.0, 0.7], device="cuda")
top_k = torch.tensor([0, 1, 5, 50, 0, 20, V + 3, 0, 3000], dtype=torch.int32, device="cuda")
top_p = torch.tensor([1.0, 0.5, 0.9, 0.99, 1.0, 0.9, 1.0, 0.9, 0.9], device="cuda")
min_p = torch.tensor([0.0, 0.0, 0.05, 0.2, 0.05, 0.0, 1.0, 0.0, 0.0], device="cuda")
rows = lambda t: t.repeat_interleave(K + 1)  # noqa: E731
cut = truncation_cut(logits, rows(temp), rows(top_k), rows(top_p), rows(min_p)).view(B, K + 1)
seeds, positions = torch.arange(B, device="cuda") + 11, torch.arange(B, device="cuda") * 3
draft = draft_sample(logits[:B].contiguous(), temp, seeds, positions, logit_cut=cut[:, 0].contiguous())
probs = torch.softmax(torch.randn(B, K, V, device="cuda"), -1)
drafts = torch.randint(0, V, (B, K), device="cuda")
num = torch.tensor([3, 2, 0, 1, 3, 3, 2, 3, 1], device="cuda")
out = rejection_sample(drafts, num, probs, logits.view(B, K + 1, V), temp, seeds, positions, logit_cut=cut)
torch.cuda.synchronize()
print("sanitize: ran draft_sample, truncation_cut, rejection_sample with cuts", draft.shape, [o.shape for o in out])
PY
    timeout 300 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 \
        python3 "$OUT/sanitize_truncation.py" > "$OUT/sanitize_truncation.log" 2>&1
    echo "compute-sanitizer memcheck: exit $?"; tail -5 "$OUT/sanitize_truncation.log"
}
case "$stage" in
tests) tests ;;
bench) bench ;;
side) side ;;
profile) profile ;;
sanitize) sanitize ;;
all) tests; bench; sanitize ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac
