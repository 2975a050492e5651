#!/usr/bin/env bash
# Draft trees on the GPU: the tree tests and the tree benches, one stage per device call
# (each fits its 10 minutes); logs under $OUT, the benches' table rows under $OUT/results
# (append them with `python benchmarks/record.py append <that folder>`):
#   bash scripts/gpu_tree.sh tests [quick]  # the tree tests on CUDA (tree ops' kernels included), then
#                                        # the 10**6-trial lossless cases (slow lane; not with quick)
#   bash scripts/gpu_tree.sh t07 [D,K,N ...]  # benchmarks/bench_tree.py --temperature 0.7: every row sampled
#   bash scripts/gpu_tree.sh 8b [verify | D,K,N ...]  # benchmarks/bench_tree_8b.py: 32-layer 8B-shaped target, B = 1
#                                        # (iteration and floor pieces timed in 3 interleaved rounds)
#   bash scripts/gpu_tree.sh 8b-profile [D,K,N ...]   # the same iterations, each one's CUDA kernels logged
#   bash scripts/gpu_tree.sh profile  # 8b-profile 7,4,32, then the demo pair's kernels at B = 1 and 8
#                                        # (plain decoding at B = 8 ran 1.46 ms per iteration, B = 32 0.86)
#   bash scripts/gpu_tree.sh batch [B ...]  # benchmarks/bench_tree_batch.py: tree vs chain, B = 1 .. 64
#   bash scripts/gpu_tree.sh demo     # benchmarks/bench_tree.py: every row greedy (the first calls' stage)
DEFAULT_OUT=/tmp/gpu_tree
source "$(dirname "$0")/gpu_setup.sh"
stage=${1:-tests}
case "$stage" in
tests)
    SPECDRAFT_DEVICE=cuda timeout 300 python3 -m pytest -q -n 12 -p no:cacheprovider -m "not interpreter" -rf \
        tests/proposers/test_tree_draft.py tests/proposers/test_tree_build.py tests/proposers/test_tree_autoregressive.py \
        tests/generation/test_tree_greedy.py tests/generation/test_tree_sampling.py \
        tests/generation/test_tree_cuda_graph.py tests/ops/sampling/test_tree_verify.py \
        tests/ops/sampling/test_tree_verify_compile.py tests/ops/sampling/test_tree_verify_lossless.py \
        tests/ops/test_tree_structure.py tests/ops/test_top_logprobs.py > "$OUT/tests_tree.log" 2>&1
    echo "tree tests: exit $?"; tail -25 "$OUT/tests_tree.log"
    [ "${2:-}" = quick ] && exit 0
    SPECDRAFT_SLOW=1 SPECDRAFT_DEVICE=cuda timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider -m slow -rf \
        tests/ops/sampling/test_tree_verify_lossless.py > "$OUT/tests_lossless_1e6.log" 2>&1
    echo "10**6-trial lossless cases: exit $?"; tail -8 "$OUT/tests_lossless_1e6.log"
    ;;
t07)
    # `t07 D,K,N ...`: just those rows (the plain baseline always runs), in a log of their own.
    shift
    rows="$*"; only=${rows:+--only $rows}; name=bench_tree_t07${rows:+_${rows//[ ,]/_}}
    timeout 560 python3 benchmarks/bench_tree.py --temperature 0.7 --budget-s 480 $only \
        > "$OUT/$name.log" 2>&1
    echo "bench_tree T = 0.7: exit $?"; grep "^|" "$OUT/$name.log"; head -3 "$OUT/$name.log"
    ;;
8b)
    # A 32-layer compile takes about a minute: the verify table (7 compiles) and the
    # configurations need separate calls. `8b verify` for the table, `8b` (or
    # `8b D,K,N ...`) for iterations against their floors.
    shift
    if [ "${1:-}" = verify ]; then
        args="--configs --budget-s 0"; name=bench_tree_8b_verify
    else
        configs=${*:-5,1,6 7,4,32 5,4,32 3,1,4}
        args="--verify-sizes --configs $configs --budget-s 380"; name=bench_tree_8b_${configs//[ ,]/_}
    fi
    timeout 580 python3 benchmarks/bench_tree_8b.py $args > "$OUT/$name.log" 2>&1
    echo "bench_tree_8b: exit $?"; grep -v "^verify\|^plain:\|^[0-9],[0-9]" "$OUT/$name.log" | tail -40
    ;;
8b-profile)
    shift
    configs=${*:-7,4,32 5,4,32 3,1,4}
    name=bench_tree_8b_profile_${configs//[ ,]/_}
    timeout 580 python3 benchmarks/bench_tree_8b.py --verify-sizes --configs $configs --budget-s 380 --profile \
        > "$OUT/$name.log" 2>&1
    echo "bench_tree_8b --profile: exit $?"; grep "^|" "$OUT/$name.log"
    ;;
profile)
    bash "$0" 8b-profile 7,4,32
    timeout 200 python3 benchmarks/bench_tree_batch.py --batch-sizes 1 8 --configs 3,1,4 3,4,8 --repeats 1 --profile \
        > "$OUT/bench_tree_batch_profile.log" 2>&1
    echo "bench_tree_batch --profile: exit $?"; grep "^|" "$OUT/bench_tree_batch_profile.log"
    ;;
batch)
    shift
    sizes=${*:-1 64 8 32 2 16 4}
    name=bench_tree_batch_${sizes// /_}
    timeout 580 python3 benchmarks/bench_tree_batch.py --budget-s 470 --batch-sizes $sizes \
        > "$OUT/$name.log" 2>&1
    echo "bench_tree_batch $sizes: exit $?"; grep "^|" "$OUT/$name.log"
    ;;
demo)
    timeout 250 python3 benchmarks/bench_tree.py --budget-s 190 2>&1 \
        | tee "$OUT/bench_tree.log" | tail -30
    ;;
*)
    echo "usage: bash scripts/gpu_tree.sh tests|t07|8b|8b-profile|profile|batch|demo" >&2
    exit 2
    ;;
esac
