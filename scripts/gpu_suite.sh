#!/usr/bin/env bash
# The whole test suite on CUDA, logs under $OUT (the device tool's output folder):
#   bash scripts/gpu_suite.sh suite-a  # the first half of the GPU suite (over every GPU); suite-b the second
#   bash scripts/gpu_suite.sh suite    # all of it (more than one 10-minute device call)
#   bash scripts/gpu_suite.sh suite-rest FILE  # the node ids in FILE (one a line) a timed-out half did not finish
# Each stage fits one 10-minute device call.
DEFAULT_OUT=/tmp/gpu_suite
source "$(dirname "$0")/gpu_setup.sh"

stage=${1:-suite-a}
case "$stage" in
suite | suite-a | suite-b)
    # The whole suite needs more than one 10-minute device call even on 2 GPUs with 24
    # workers: suite-a and suite-b are its two halves by directory (a: ops, models,
    # structure, testing, assets; b: proposers, generation, training, the top-level
    # tests). Workers spread over every GPU (SPECDRAFT_GPUS, tests/conftest.py); -v names
    # each test in the log as it ends, so a timed-out half still says what ran.
    case "$stage" in
    suite-a) PART=(tests/ops tests/models tests/structure tests/testing tests/assets) ;;
    suite-b) PART=(tests/proposers tests/generation tests/training tests/test_*.py) ;;
    *) PART=(tests) ;;
    esac
    NGPU=$(nvidia-smi -L | wc -l)
    SPECDRAFT_GPUS=$NGPU SPECDRAFT_DEVICE=cuda timeout 530 python3 -m pytest -v -n $((12 * NGPU)) \
        -m "not interpreter" -p no:cacheprovider -p no:benchmark -rfEs --durations=30 "${PART[@]}" \
        > "$OUT/${stage}.log" 2>&1
    echo "pytest exit $?"
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/${stage}.log" | tail -25
    grep -c PASSED "$OUT/${stage}.log"
    ;;
suite-rest)
    # The tests a timed-out half did not finish: one node id per line in $2.
    SPECDRAFT_DEVICE=cuda timeout ${LIMIT:-250} xargs -a "$2" -d '\n' python3 -m pytest -v -n 12 --dist loadfile -p no:cacheprovider \
        -p no:benchmark -rfEs --durations=25 > "$OUT/$(basename "$2" .txt).log" 2>&1
    echo "pytest exit $?"
    grep -E "^(FAILED|ERROR)|passed|failed|PASSED" "$OUT/$(basename "$2" .txt).log" | tail -25
    ;;
*)
    echo "usage: bash scripts/gpu_suite.sh suite|suite-a|suite-b|suite-rest FILE" >&2
    exit 2
    ;;
esac
