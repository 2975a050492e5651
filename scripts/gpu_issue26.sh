#!/usr/bin/env bash
# Issue 26's GPU points in one device call, logs under $OUT:
#   bash scripts/gpu_issue26.sh
# 1. the tree tests on CUDA (draft exactness, greedy and sampled decoding, the
#    tree_verify op's Triton kernels against the reference and the oracle);
# 2. benchmarks/bench_tree.py: chains and trees on the demo pair, B = 1, compiled
#    with mode="reduce-overhead" (acceptance length, decode tokens/s, lossless check).
DEFAULT_OUT=/tmp/gpu_issue26
source "$(dirname "$0")/gpu_setup.sh"
SPECDRAFT_DEVICE=cuda timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider -m "not interpreter" -rf \
    tests/proposers/test_tree_draft.py tests/proposers/test_tree_build.py tests/generation/test_tree_greedy.py \
    tests/generation/test_tree_sampling.py tests/generation/test_tree_cuda_graph.py tests/ops/sampling/ tests/ops/test_tree_structure.py \
    tests/testing/test_invalid_strategies.py -k "tree" 2>&1 | tee "$OUT/tests_tree.log" | tail -25
timeout 250 python3 benchmarks/bench_tree.py --budget-s 190 --json "$OUT/bench_tree.json" 2>&1 | tee "$OUT/bench_tree.log" | tail -30
