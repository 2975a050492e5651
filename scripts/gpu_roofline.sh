#!/usr/bin/env bash
# Issue 41 (the roofline) on the GPU, logs under $OUT, table rows under $OUT/results
# (append them with `python benchmarks/record.py append <that folder>`):
#   bash scripts/gpu_roofline.sh tests   # the model, attention, proposer and generation tests on CUDA
#   bash scripts/gpu_roofline.sh bench   # benchmarks/bench_roofline.py: 8B-shaped target forward and
#                                        # draft step against copy bandwidth, both attention forms
#   bash scripts/gpu_roofline.sh all     # both (about 9 minutes on one H200)
DEFAULT_OUT=/tmp/gpu_roofline
source "$(dirname "$0")/gpu_setup.sh"
stage=${1:-all}
tests() {
    SPECDRAFT_DEVICE=cuda timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -n 12 -p no:cacheprovider -m "not interpreter" -rfE \
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
