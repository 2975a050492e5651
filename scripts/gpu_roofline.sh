#!/usr/bin/env bash
# Issue 41 (the roofline) on the GPU, logs under $OUT, table rows under $OUT/results
# (append them with `python benchmarks/record.py append <that folder>`):
#   bash scripts/gpu_roofline.sh tests   # masked_paged_attention's tests, then the model, proposer,
#                                        # generation and demo tests on CUDA
#   bash scripts/gpu_roofline.sh bench   # benchmarks/bench_roofline.py: 8B-shaped target forward and
#                                        # draft step against copy bandwidth, each attention form
#   bash scripts/gpu_roofline.sh all     # both (about 10 minutes on one H200)
# TESTS_TIMEOUT, BENCH_TIMEOUT (seconds) and BENCH_ARGS (bench_roofline.py's) override the defaults.
DEFAULT_OUT=/tmp/gpu_roofline
source "$(dirname "$0")/gpu_setup.sh"
stage=${1:-all}
tests() {
    SPECDRAFT_DEVICE=cuda timeout 120 python3 -m pytest -q -n 12 -p no:cacheprovider -m "not interpreter" -rfE \
        tests/ops/test_paged_attention.py tests/models/test_attention.py > "$OUT/tests_paged_attention.log" 2>&1
    echo "masked_paged_attention tests: exit $?"; tail -8 "$OUT/tests_paged_attention.log"
    SPECDRAFT_DEVICE=cuda timeout ${TESTS_TIMEOUT:-400} python3 -m pytest -q -n 12 -p no:cacheprovider -m "not interpreter" -rfE \
        tests/models tests/proposers tests/generation tests/test_demo.py > "$OUT/tests_roofline.log" 2>&1
    echo "model / proposer / generation tests: exit $?"; tail -15 "$OUT/tests_roofline.log"
}
bench() {
    (cd benchmarks && timeout ${BENCH_TIMEOUT:-330} python3 bench_roofline.py ${BENCH_ARGS:-} > "$OUT/bench_roofline.log" 2>&1)
    echo "bench_roofline: exit $?"; grep -v "^$" "$OUT/bench_roofline.log" | tail -20
}
case "$stage" in
    tests) tests ;;
    bench) bench ;;
    all) tests; bench ;;
    *) echo "unknown stage $stage (tests | bench | all)"; exit 2 ;;
esac
