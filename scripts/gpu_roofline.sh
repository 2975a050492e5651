#!/usr/bin/env bash
# Issue 41 (the roofline) on the GPU, logs under $OUT, table rows under $OUT/results
# (append them with `python benchmarks/record.py append <that folder>`):
#   bash scripts/gpu_roofline.sh tests   # masked_paged_attention's tests, then the model, proposer,
#                                        # generation and demo tests on CUDA
#   bash scripts/gpu_roofline.sh bench   # benchmarks/bench_roofline.py: 8B-shaped target forward and
#                                        # draft step against copy bandwidth, each attention form
#   bash scripts/gpu_roofline.sh all     # both (about 10 minutes on one H200)
#   bash scripts/gpu_roofline.sh demo    # point 5, the demo pair at B = 1: models/linear.py's tests on CUDA,
#                                        # bench_small_linear.py, then bench_tree.py's chains (and a 16-node
#                                        # tree; $DEMO_ROWS) with few-row fp32 linears as cuBLAS, then as
#                                        # reductions (SPECDRAFT_SMALL_LINEAR), each against plain decoding
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
demo() {
    SPECDRAFT_DEVICE=cuda timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider -m "not interpreter" -rfE \
        tests/models/test_linear.py tests/models/test_models_compile.py > "$OUT/tests_small_linear.log" 2>&1
    echo "small-linear tests: exit $?"; tail -4 "$OUT/tests_small_linear.log"
    (cd benchmarks && timeout 150 python3 bench_small_linear.py > "$OUT/bench_small_linear.log" 2>&1)
    echo "bench_small_linear: exit $?"; grep -v "^$" "$OUT/bench_small_linear.log" | tail -24
    for form in blas reduction; do
        SPECDRAFT_SMALL_LINEAR=$form timeout 200 python3 benchmarks/bench_tree.py --only ${DEMO_ROWS:-3,1,4 5,1,6 7,1,8 5,4,16} \
            --json "$OUT/tree_$form.json" > "$OUT/bench_tree_$form.log" 2>&1
        echo "bench_tree, small linears as $form: exit $?"; grep -v "^|" "$OUT/bench_tree_$form.log" | grep -v "^$" | tail -4
        grep "^|" "$OUT/bench_tree_$form.log"
    done
}
case "$stage" in
    tests) tests ;;
    demo) demo ;;
    bench) bench ;;
    all) tests; bench ;;
    *) echo "unknown stage $stage (tests | bench | all | demo)"; exit 2 ;;
esac
