#!/usr/bin/env bash
# Training on the GPU: its tests and benches, logs under $OUT (the device tool's output
# folder), the benches' table rows under $OUT/results (append them with
# `python benchmarks/record.py append <that folder>`):
#   bash scripts/gpu_training.sh unroll   # the unroll's CUDA tests, bench_unroll at S = 1, 2, 8
#   bash scripts/gpu_training.sh eval     # the eval CLI at the 8B shape, bench_vocab_metrics
#   bash scripts/gpu_training.sh vocab    # the vocab_metrics and training tests, bench_vocab_metrics
# Each stage fits one 10-minute device call; every step has its own time limit so
# that one hang cannot take the others' logs with it.
DEFAULT_OUT=/tmp/gpu_training
source "$(dirname "$0")/gpu_setup.sh"

case "${1:-unroll}" in
unroll)
    SPECDRAFT_DEVICE=cuda timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider \
        tests/training/test_unroll_attention.py tests/training/test_unroll_flex_compile.py \
        tests/test_poisoned_empty.py 2>&1 | tee "$OUT/tests_unroll.log" | tail -30
    timeout 330 python3 benchmarks/bench_unroll.py 2>&1 | tee "$OUT/bench_unroll.log" | tail -40
    ;;
eval)
    # The 8B-shaped eval CLI did not finish within 150 s in the first session (compile
    # or hang unknown): a longer limit, and the compile status line on stderr says which.
    timeout 60 python3 scripts/eval_8b_shards.py /tmp/e8b --sequences 1 2 4 3 && \
        timeout 420 python3 -m specdraft.eval /tmp/e8b/head /tmp/e8b/shards --device cuda --steps 7 \
        --json "$OUT/eval_cli.json" 2>&1 | tee "$OUT/eval_cli.log" | tail -30
    timeout 100 python3 benchmarks/bench_vocab_metrics.py 2>&1 | tee "$OUT/bench_vocab_metrics.log" | tail -30
    ;;
vocab)
    SPECDRAFT_DEVICE=cuda timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider -p no:benchmark -rfE \
        tests/ops/test_vocab_metrics.py tests/training/test_metrics.py tests/training/test_evaluate.py \
        2>&1 | tee "$OUT/tests_vocab.log" | tail -15
    timeout 240 python3 benchmarks/bench_vocab_metrics.py --tiles --no-compile 2>&1 | tee "$OUT/bench_vocab_metrics.log" | tail -60
    ;;
*)
    echo "usage: bash scripts/gpu_training.sh unroll|eval|vocab" >&2
    exit 2
    ;;
esac
