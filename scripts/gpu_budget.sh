#!/usr/bin/env bash
# Budgeted verification (issue 39) on the GPU: its tests and benches, one stage per device call;
# logs under $OUT, the benches' table rows under $OUT/results (append them with
# `python benchmarks/record.py append <that folder>`):
#   bash scripts/gpu_budget.sh tests       # the budget tests on CUDA (tests/generation/test_budget.py,
#                                          # test_step_costs.py, tests/ops/test_budget_keep*.py)
#   bash scripts/gpu_budget.sh bench [GPUS]   # benchmarks/bench_budget.py over B = 1 .. 256, the batch sizes
#                                          # dealt to GPUS processes (default: every visible GPU), one GPU each;
#                                          # then benchmarks/bench_budget_keep.py on GPU 0
#   bash scripts/gpu_budget.sh all         # tests, then bench (a 4-GPU machine: about 8 minutes)
DEFAULT_OUT=/tmp/gpu_budget
source "$(dirname "$0")/gpu_setup.sh"
stage=${1:-tests}
[ $# -gt 0 ] && shift
tests() {
    shopt -s nullglob
    files=(tests/generation/test_budget*.py tests/generation/test_step_costs.py tests/ops/test_budget_keep*.py)
    shopt -u nullglob
    echo "test files: ${files[*]}"
    SPECDRAFT_DEVICE=cuda timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider -m "not interpreter" -rf \
        "${files[@]}" > "$OUT/tests_budget.log" 2>&1
    echo "budget tests: exit $?"; tail -15 "$OUT/tests_budget.log"
}
bench() {
    local gpus=${1:-$(nvidia-smi -L | wc -l)}
    # Deal the batch sizes so that each process gets a mix of small and large ones.
    local sizes=(256 128 64 32 16 8 4 2 1) pids=() i
    for ((i = 0; i < gpus; i++)); do
        local mine=()
        for ((j = i; j < ${#sizes[@]}; j += gpus)); do mine+=("${sizes[j]}"); done
        [ ${#mine[@]} -eq 0 ] && continue
        CUDA_VISIBLE_DEVICES=$i BENCH_RESULTS=$OUT/results_$i timeout 560 python3 benchmarks/bench_budget.py \
            --batch-sizes "${mine[@]}" --json "$OUT/budget_$i.json" > "$OUT/bench_budget_$i.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; echo "bench_budget process $p: exit $?"; done
    mkdir -p "$OUT/results"
    cat "$OUT"/results_*/budget.jsonl >> "$OUT/results/budget.jsonl" 2>/dev/null
    for f in "$OUT"/bench_budget_*.log; do echo "== $f"; grep "^|" "$f"; done
    if [ -f benchmarks/bench_budget_keep.py ]; then
        timeout 200 python3 benchmarks/bench_budget_keep.py > "$OUT/bench_budget_keep.log" 2>&1
        echo "bench_budget_keep: exit $?"; grep "^|" "$OUT/bench_budget_keep.log" | tail -20
    fi
}
case "$stage" in
tests) tests ;;
bench) bench "$@" ;;
all) tests; bench "$@" ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac
