#!/usr/bin/env bash
# Issue 26's GPU points, one stage per device call (each fits its 10 minutes), logs under $OUT:
#   bash scripts/gpu_issue26.sh tests    # the tree tests on CUDA (tree ops' kernels included), then
#                                        # the 10**6-trial lossless cases (slow lane) and T = 0.7 rows
#   bash scripts/gpu_issue26.sh 8b       # benchmarks/bench_tree_8b.py: 32-layer 8B-shaped target, B = 1
#   bash scripts/gpu_issue26.sh batch    # benchmarks/bench_tree_batch.py: tree vs chain, B = 1 .. 64
#   bash scripts/gpu_issue26.sh demo     # benchmarks/bench_tree.py: every row greedy (the first calls' stage)
DEFAULT_OUT=/tmp/gpu_issue26
source "$(dirname "$0")/gpu_setup.sh"
stage=${1:-tests}
case "$stage" in
tests)
    SPECDRAFT_DEVICE=cuda timeout 170 python3 -m pytest -q -n 8 -p no:cacheprovider -m "not interpreter" -rf \
        tests/proposers/test_tree_draft.py tests/proposers/test_tree_build.py tests/generation/test_tree_greedy.py \
        tests/generation/test_tree_sampling.py tests/generation/test_tree_cuda_graph.py tests/ops/sampling/ \
        tests/ops/test_tree_structure.py tests/testing/test_invalid_strategies.py -k "tree" 2>&1 \
        | tee "$OUT/tests_tree.log" | tail -25
    SPECDRAFT_SLOW=1 SPECDRAFT_DEVICE=cuda timeout 120 python3 -m pytest -q -n 4 -p no:cacheprovider -m slow -rf \
        tests/ops/sampling/test_tree_verify_lossless.py 2>&1 | tee "$OUT/tests_lossless_1e6.log" | tail -8
    timeout 270 python3 benchmarks/bench_tree.py --temperature 0.7 --budget-s 220 \
        --json "$OUT/bench_tree_t07.json" 2>&1 | tee "$OUT/bench_tree_t07.log" | tail -20
    ;;
8b)
    timeout 580 python3 benchmarks/bench_tree_8b.py --budget-s 430 --json "$OUT/bench_tree_8b.json" 2>&1 \
        | tee "$OUT/bench_tree_8b.log" | tail -40
    ;;
batch)
    timeout 580 python3 benchmarks/bench_tree_batch.py --budget-s 470 --json "$OUT/bench_tree_batch.json" 2>&1 \
        | tee "$OUT/bench_tree_batch.log" | tail -45
    ;;
demo)
    timeout 250 python3 benchmarks/bench_tree.py --budget-s 190 --json "$OUT/bench_tree.json" 2>&1 \
        | tee "$OUT/bench_tree.log" | tail -30
    ;;
*)
    echo "usage: bash scripts/gpu_issue26.sh tests|8b|batch|demo" >&2
    exit 2
    ;;
esac
