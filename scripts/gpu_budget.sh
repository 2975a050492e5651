#!/usr/bin/env bash
# Budgeted verification (issue 39) on the GPU: its tests and benches, one stage per device call;
# logs under $OUT, the benches' table rows under $OUT/results (append them with
# `python benchmarks/record.py append <that folder>`):
#   bash scripts/gpu_budget.sh tests       # the budget tests on CUDA (tests/generation/test_budget.py,
#                                          # test_step_costs.py, tests/ops/test_budget_keep*.py)
#   bash scripts/gpu_budget.sh bench [GPU ...]   # benchmarks/bench_budget.py over B = 1 .. 256 (or
#                                          # $BENCH_SIZES), the batch sizes dealt in turn to one process per GPU
#                                          # named (default: every visible GPU)
#   bash scripts/gpu_budget.sh ops         # benchmarks/bench_budget_keep.py and bench_truncation.py, and the
#                                          # truncation op's tests, on GPU 0
#   bash scripts/gpu_budget.sh trees [GPU ...]   # budgets over draft trees: their tests on CUDA on the first GPU
#                                          # named while bench_budget.py's tree rows (and plain, fixed K = 3) at
#                                          # B = $BENCH_SIZES (default 1 16 64 256) run on the others
#   bash scripts/gpu_budget.sh projection  # the offline budget curve's tests on CUDA (the evaluator, draft_metrics,
#                                          # the eval CLI), then benchmarks/bench_budget_8b.py (the 8B-shaped
#                                          # projection by batch size) on GPU 0
#   bash scripts/gpu_budget.sh side [TIMEOUT]   # the budget-table tests on CUDA, then bench_budget.py --side-by-side
#                                          # (one process, interleaved rounds) at B = $BENCH_SIZES (default 1 16 256);
#                                          # TREES=1: the tree's configurations and a TreeCosts auto;
#                                          # BOTH=1: chains' and the tree's, and a ChainOrTree auto
#                                          # CONTROL=1: a second copy of the fastest configuration (noise)
#   bash scripts/gpu_budget.sh all         # an 8-GPU machine: tests then ops on GPU 0 while bench runs on
#                                          # GPUs 1-7 (about 8 minutes)
# SPECDRAFT_SMALL_LINEAR=reduction in front of a stage measures with few-row fp32 linears as reductions
# (models/linear.py); the rows carry the form, and `bench_budget.py --write-costs` run with the same
# variable writes the demo pair's tables from that form's rows only.
DEFAULT_OUT=/tmp/gpu_budget
source "$(dirname "$0")/gpu_setup.sh"
stage=${1:-tests}
[ $# -gt 0 ] && shift
tests() {
    shopt -s nullglob
    files=(tests/generation/test_budget*.py tests/generation/test_step_costs.py tests/ops/test_budget_keep*.py)
    shopt -u nullglob
    echo "test files: ${files[*]}"
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} SPECDRAFT_DEVICE=cuda timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider -m "not interpreter" -rf \
        "${files[@]}" > "$OUT/tests_budget.log" 2>&1
    echo "budget tests: exit $?"; tail -15 "$OUT/tests_budget.log"
}
bench() {
    local gpus=("$@")
    [ ${#gpus[@]} -eq 0 ] && mapfile -t gpus < <(seq 0 $(($(nvidia-smi -L | wc -l) - 1)))
    # Deal the batch sizes so that each process gets a mix of small and large ones.
    local sizes=(${BENCH_SIZES:-256 128 64 32 16 8 4 2 1}) pids=() i j n=${#gpus[@]}
    for ((i = 0; i < n; i++)); do
        local mine=()
        for ((j = i; j < ${#sizes[@]}; j += n)); do mine+=("${sizes[j]}"); done
        [ ${#mine[@]} -eq 0 ] && continue
        local g=${gpus[i]}
        CUDA_VISIBLE_DEVICES=$g BENCH_RESULTS=$OUT/results_$g timeout 560 python3 benchmarks/bench_budget.py \
            --batch-sizes "${mine[@]}" --json "$OUT/budget_$g.json" > "$OUT/bench_budget_$g.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; echo "bench_budget process $p: exit $?"; done
    mkdir -p "$OUT/results"
    cat "$OUT"/results_*/budget.jsonl >> "$OUT/results/budget.jsonl" 2>/dev/null
    for f in "$OUT"/bench_budget_*.log; do echo "== $f"; grep "^|" "$f"; done
}
ops() {
    CUDA_VISIBLE_DEVICES=0 SPECDRAFT_DEVICE=cuda timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider \
        -m "not interpreter" -rf tests/ops/sampling/test_truncation.py > "$OUT/tests_truncation.log" 2>&1
    echo "truncation tests: exit $?"; tail -5 "$OUT/tests_truncation.log"
    for b in bench_budget_keep bench_truncation; do
        CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/$b.py > "$OUT/$b.log" 2>&1
        echo "$b: exit $?"; grep "^|" "$OUT/$b.log" | tail -24
    done
}
trees() {
    local gpus=("$@")
    [ ${#gpus[@]} -eq 0 ] && mapfile -t gpus < <(seq 0 $(($(nvidia-smi -L | wc -l) - 1)))
    local first=${gpus[0]} rest=("${gpus[@]:1}")
    [ ${#rest[@]} -eq 0 ] && rest=("$first")
    (
        local sizes=(${BENCH_SIZES:-256 64 16 1}) i j n=${#rest[@]} pids=()
        for ((i = 0; i < n; i++)); do
            local mine=()
            for ((j = i; j < ${#sizes[@]}; j += n)); do mine+=("${sizes[j]}"); done
            [ ${#mine[@]} -eq 0 ] && continue
            CUDA_VISIBLE_DEVICES=${rest[i]} BENCH_RESULTS=$OUT/results_${rest[i]} timeout 540 python3 \
                benchmarks/bench_budget.py --batch-sizes "${mine[@]}" --only fixed:3 tree:4 tree-budget:4:1 \
                tree-budget:4:3 > "$OUT/bench_tree_budget_${rest[i]}.log" 2>&1 &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p"; echo "bench_budget (trees) process $p: exit $?"; done
    ) > "$OUT/bench_trees.txt" 2>&1 &
    local bench_pid=$!
    CUDA_VISIBLE_DEVICES=$first SPECDRAFT_DEVICE=cuda timeout 400 python3 -m pytest -q -n 8 -p no:cacheprovider \
        -m "not interpreter" -rf tests/generation/test_tree_budget.py tests/generation/test_tree_cuda_graph.py \
        tests/generation/test_tree_greedy.py tests/generation/test_tree_sampling.py tests/ops/sampling/test_tree_verify.py \
        tests/models/test_attention.py > "$OUT/tests_tree_budget.log" 2>&1
    echo "tree budget tests: exit $?"; tail -15 "$OUT/tests_tree_budget.log"
    wait $bench_pid; cat "$OUT/bench_trees.txt"
    mkdir -p "$OUT/results"
    cat "$OUT"/results_*/budget.jsonl >> "$OUT/results/budget.jsonl" 2>/dev/null
    for f in "$OUT"/bench_tree_budget_*.log; do echo "== $f"; grep "^|" "$f"; done
}
projection() {
    CUDA_VISIBLE_DEVICES=0 SPECDRAFT_DEVICE=cuda timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider \
        -m "not interpreter" -rf tests/training/test_budget_curve.py tests/training/test_evaluate.py \
        tests/training/test_metrics.py tests/test_eval.py > "$OUT/tests_budget_curve.log" 2>&1
    echo "budget curve tests: exit $?"; tail -8 "$OUT/tests_budget_curve.log"
    CUDA_VISIBLE_DEVICES=0 timeout 330 python3 benchmarks/bench_budget_8b.py --json "$OUT/budget_8b.json" \
        > "$OUT/bench_budget_8b.log" 2>&1
    echo "bench_budget_8b: exit $?"; grep -v "^|" "$OUT/bench_budget_8b.log" | tail -12; grep "^|" "$OUT/bench_budget_8b.log"
}
side() {
    if [ -z "${SKIP_TESTS:-}" ]; then
        CUDA_VISIBLE_DEVICES=0 SPECDRAFT_DEVICE=cuda timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider \
            -m "not interpreter" -rf tests/generation/test_step_costs.py tests/generation/test_budget.py \
            tests/generation/test_tree_costs.py tests/generation/test_tree_budget.py tests/generation/test_chain_or_tree.py \
            > "$OUT/tests_step_costs.log" 2>&1
        echo "step-cost and budget tests: exit $?"; tail -6 "$OUT/tests_step_costs.log"
    fi
    CUDA_VISIBLE_DEVICES=0 timeout "${1:-420}" python3 benchmarks/bench_budget.py --side-by-side ${TREES:+--trees} ${BOTH:+--both} ${CONTROL:+--control} \
        --batch-sizes ${BENCH_SIZES:-1 16 256} --rounds ${ROUNDS:-21} > "$OUT/bench_side_by_side.log" 2>&1
    echo "bench_budget --side-by-side: exit $?"; grep -v "^|" "$OUT/bench_side_by_side.log" | tail -12
    grep "^|" "$OUT/bench_side_by_side.log"
}
case "$stage" in
tests) tests ;;
side) side "$@" ;;
projection) projection ;;
trees) trees "$@" ;;
bench) bench "$@" ;;
ops) ops ;;
all)  # GPU 0: tests, ops, then its share of the batch sizes; GPUs 1..: theirs meanwhile
    n=$(nvidia-smi -L | wc -l)
    BENCH_SIZES=${BENCH_SIZES:-256 128 64 32 16 8 4 2 1}
    sizes=($BENCH_SIZES); others=() mine=()
    for ((i = 0; i < ${#sizes[@]}; i++)); do
        if ((i % n == n - 1)); then mine+=("${sizes[i]}"); else others+=("${sizes[i]}"); fi
    done
    if ((n > 1)); then BENCH_SIZES="${others[*]}" bench $(seq 1 $((n - 1))) > "$OUT/bench_others.txt" 2>&1 & fi
    bench_pid=$!
    CUDA_VISIBLE_DEVICES=0 tests; ops
    [ ${#mine[@]} -gt 0 ] && BENCH_SIZES="${mine[*]}" bench 0
    ((n > 1)) && { wait $bench_pid; cat "$OUT/bench_others.txt"; }
    ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac
