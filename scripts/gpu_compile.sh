#!/usr/bin/env bash
# Issue 41's cold-compile point on the GPU, logs under $OUT, table rows under
# $OUT/results (append them with `python benchmarks/record.py append <that folder>`):
#   bash scripts/gpu_compile.sh tests      # the model, proposer, generation, demo, eval and
#                                          # training-eval and metrics tests on CUDA
#   bash scripts/gpu_compile.sh compile    # benchmarks/bench_compile.py at the 8B shape, 32 target
#                                          # layers: plain and speculative iteration, cold and warm
#   bash scripts/gpu_compile.sh dynamic    # bench_compile.py: the 8B-shaped EAGLE-3 propose under plain
#                                          # torch.compile(dynamic=True), cold and warm, and its Dynamo traces
#   bash scripts/gpu_compile.sh roofline   # bench_roofline.py's runtimes (kernel form, N = 1 and 16)
#   bash scripts/gpu_compile.sh loop-order # bench_roofline.py's runtimes and cold compiles (kernel form, N = 1
#                                          # and 16) with Inductor's loop reordering after fusion off
#                                          # (TORCHINDUCTOR_LOOP_ORDERING_AFTER_FUSION=0), then on (the default),
#                                          # each on fresh cache folders; the rows say which (inductor_env)
#   bash scripts/gpu_compile.sh bytecode   # the compile stage with Python bytecode caches, as a pip-installed
#                                          # torch has them (the device machine's torch has none and sets
#                                          # PYTHONDONTWRITEBYTECODE=1): torch, triton and specdraft compiled to
#                                          # bytecode first (compileall, under PYTHONPYCACHEPREFIX), then timed
#   bash scripts/gpu_compile.sh eval8b     # the eval CLI at the 8B shape (scripts/eval_8b_shards.py: 8 shards of
#                                          # 2 x 2k tokens, K = 7): its first shard cold (a fresh Inductor and
#                                          # Triton cache), warm (the same caches again), and cold with --budget
#                                          # (EVAL_RUNS="cold" for the first alone)
# OLD_SRC=<folder holding an older specdraft package> runs the compile / roofline stage on
# that tree first (PYTHONPATH), then on this one: a before / after on one machine. Rows
# record BENCH_COMMIT (this tree) and OLD_COMMIT (the older one).
DEFAULT_OUT=/tmp/gpu_compile
source "$(dirname "$0")/gpu_setup.sh"
stage=${1:-compile}
tests() {
    SPECDRAFT_DEVICE=cuda timeout ${TESTS_TIMEOUT:-330} python3 -m pytest -q -n 12 -p no:cacheprovider \
        -m "not interpreter" -rfE tests/models tests/proposers tests/generation tests/test_demo.py \
        tests/test_eval.py tests/training/test_evaluate.py tests/training/test_metrics.py > "$OUT/tests_compile.log" 2>&1
    echo "CUDA tests: exit $?"; tail -15 "$OUT/tests_compile.log"
}
# run_on <label> <command...>: the command in benchmarks/, on OLD_SRC's tree for "before".
run_on() {
    local label=$1; shift
    (
        if [ "$label" = before ]; then export PYTHONPATH="$(realpath "$OLD_SRC")" BENCH_COMMIT="${OLD_COMMIT:-unknown}"; fi
        python3 -c "import specdraft; print('$label: specdraft from', specdraft.__file__)" | tee -a "$OUT/gpu.txt"
        cd benchmarks && "$@"
    )
}
each_tree() {  # each_tree <name> <timeout> <command...>
    local name=$1 limit=$2; shift 2
    for label in ${OLD_SRC:+before} after; do
        run_on "$label" timeout "$limit" "$@" > "$OUT/${name}_$label.log" 2>&1
        echo "$name ($label): exit $?"; grep -v "^$" "$OUT/${name}_$label.log" | tail -5
    done
}
case "$stage" in
    tests) tests ;;
    compile) each_tree bench_compile ${COMPILE_TIMEOUT:-270} python3 bench_compile.py --device cuda --shape 8b \
                 --layers 32 --what "plain iteration" "speculative iteration" ;;
    dynamic) each_tree bench_compile_dynamic ${COMPILE_TIMEOUT:-270} python3 bench_compile.py --device cuda --shape 8b \
                 --inductor-defaults --dynamic --what propose "probabilistic propose" ;;
    roofline) each_tree bench_roofline ${ROOFLINE_TIMEOUT:-150} python3 bench_roofline.py --tokens 1 16 --forms kernel ;;
    loop-order)
        for setting in 0 default; do
            (
                [ "$setting" = default ] || export TORCHINDUCTOR_LOOP_ORDERING_AFTER_FUSION=$setting
                export TORCHINDUCTOR_CACHE_DIR=$OUT/cache_$setting/inductor TRITON_CACHE_DIR=$OUT/cache_$setting/triton
                cd benchmarks && timeout ${ROOFLINE_TIMEOUT:-200} python3 bench_roofline.py --tokens 1 16 --forms kernel \
                    > "$OUT/bench_roofline_loop_order_$setting.log" 2>&1
            )
            echo "bench_roofline, loop reordering $setting: exit $?"
            grep -v "^$" "$OUT/bench_roofline_loop_order_$setting.log" | tail -6
        done ;;
    bytecode)
        echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}" | tee -a "$OUT/gpu.txt"
        unset PYTHONDONTWRITEBYTECODE
        export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$OUT/pycache}
        dirs=$(python3 -c "import os, torch, triton; print(os.path.dirname(torch.__file__), os.path.dirname(triton.__file__))")
        start=$(date +%s)
        timeout 240 python3 -m compileall -q -j 0 $dirs src > "$OUT/compileall.log" 2>&1
        echo "compileall: exit $?, $(( $(date +%s) - start )) s, $(du -sh "$PYTHONPYCACHEPREFIX" | cut -f1)" | tee -a "$OUT/gpu.txt"
        each_tree bench_compile_bytecode ${COMPILE_TIMEOUT:-300} python3 bench_compile.py --device cuda --shape 8b \
            --layers 32 --what "speculative iteration" "plain iteration" ;;
    eval8b)
        timeout 150 python3 scripts/eval_8b_shards.py /tmp/e8b --sequences 2 2 2 2 2 2 2 2 > "$OUT/shards.log" 2>&1
        echo "shards: exit $?"; tail -2 "$OUT/shards.log"
        for run in ${EVAL_RUNS:-cold warm budget_cold}; do
            cache=$OUT/cache_cold extra=()  # warm: the cold run's caches again
            [ "$run" = budget_cold ] && cache=$OUT/cache_budget extra=(--budget 3.5)
            start=$(date +%s.%N)
            TORCHINDUCTOR_CACHE_DIR=$cache/inductor TRITON_CACHE_DIR=$cache/triton timeout 240 python3 -m specdraft.eval \
                /tmp/e8b/head /tmp/e8b/shards --device cuda --steps 7 --no-progress "${extra[@]}" \
                --json "$OUT/eval8b_$run.json" > "$OUT/eval8b_$run.log" 2>&1
            echo "eval8b $run: exit $?, $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s wall"
            grep "tokens/s" "$OUT/eval8b_$run.log"
        done ;;
    *) echo "unknown stage $stage (tests | compile | dynamic | roofline | loop-order | bytecode | eval8b)"; exit 2 ;;
esac
