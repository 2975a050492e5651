#!/usr/bin/env bash
# Block drafters (DFlash, DSpark; issue 38) on the GPU: their tests and benches, one stage per
# device call (each fits its 10 minutes); logs under $OUT, the benches' table rows under
# $OUT/results (append them with `python benchmarks/record.py append <that folder>`):
#   bash scripts/gpu_block.sh tests        # the block drafters' tests on CUDA (the files that exist of
#                                          # tests/{models,proposers,generation,training}/test_block*.py and
#                                          # tests/ops/test_markov*.py)
#   bash scripts/gpu_block.sh bench8b [ARGS ...]   # benchmarks/bench_block_8b.py: 32-layer 8B-shaped target,
#                                          # DSpark then DFlash; default --batch-sizes 1 --budget-s 300
#                                          # (`bench8b --batch-sizes 8` for B = 8: one B per call)
#   bash scripts/gpu_block.sh bench8b-profile   # the same at 2 target layers, every piece's kernels logged
#   bash scripts/gpu_block.sh pair [greedy|t07] [B ...]   # benchmarks/bench_block_pair.py on CUDA: EAGLE-3
#                                          # chain 7 and tree (7, 4, 32), DFlash 7, DSpark 7, default B = 1 8
#   bash scripts/gpu_block.sh pair-cpu [greedy|t07] [B ...]   # the same with --device cpu (the README
#                                          # table's CPU rows), Inductor with the demo's options
#   bash scripts/gpu_block.sh train [dflash|dspark]   # scripts/train_block_drafters.py: the demo's DFlash and
#                                          # DSpark heads (default both) on the shipped target, with the EAGLE-3
#                                          # head's data and budget (training.json: --budget-s 105 per head), into
#                                          # $OUT/demo_heads/{dflash,dspark,training.json}: copy them into
#                                          # src/specdraft/assets/demo_pair/ (one drafter per call: copy between the
#                                          # calls, so the second run's training.json keeps the first's entry);
#                                          # TRAIN_ARGS adds options (`TRAIN_ARGS="--budget-s 400"`: to
#                                          # --head-steps 3000, the EAGLE-3 head's steps, not its seconds)
# The trained demo heads are read from src/specdraft/assets/demo_pair/{dflash,dspark} (or set
# BLOCK_HEADS="--dflash DIR --dspark DIR"); without them the pair bench runs random stand-ins and
# records nothing for them. DSpark needs specdraft.ops.markov_block_sample.
DEFAULT_OUT=/tmp/gpu_block
source "$(dirname "$0")/gpu_setup.sh"
stage=${1:-tests}
[ $# -gt 0 ] && shift
pair() {
    # pair DEVICE [greedy|t07] [B ...]
    local device=$1; shift
    local sampling=greedy
    case "${1:-}" in greedy) shift ;; t07) sampling=sampled; shift ;; esac
    local sizes=${*:-1 8}
    local name=bench_block_pair_${device}_${sampling}_b${sizes// /_}
    timeout 580 python3 benchmarks/bench_block_pair.py --device "$device" --sampling "$sampling" \
        --batch-sizes $sizes --budget-s 450 ${BLOCK_HEADS:-} > "$OUT/$name.log" 2>&1
    echo "bench_block_pair $device $sampling B = $sizes: exit $?"
    grep "^|\|^NOTE\|^DSpark\|head (" "$OUT/$name.log"; tail -2 "$OUT/$name.log"
}
case "$stage" in
tests)
    shopt -s nullglob
    files=(tests/models/test_block*.py tests/proposers/test_block*.py tests/generation/test_block*.py
           tests/ops/test_markov*.py tests/training/test_block*.py)
    shopt -u nullglob
    if [ ${#files[@]} -eq 0 ]; then echo "no block drafter tests in this tree"; exit 1; fi
    echo "test files: ${files[*]}"
    SPECDRAFT_DEVICE=cuda timeout 480 python3 -m pytest -q -n 12 -p no:cacheprovider -m "not interpreter" -rf \
        "${files[@]}" > "$OUT/tests_block.log" 2>&1
    echo "block drafter tests: exit $?"; tail -25 "$OUT/tests_block.log"
    ;;
bench8b)
    args=${*:---batch-sizes 1 --budget-s 300}
    name=bench_block_8b_${args//[^a-z0-9]/_}
    timeout 580 python3 benchmarks/bench_block_8b.py $args > "$OUT/$name.log" 2>&1
    echo "bench_block_8b $args: exit $?"; grep -v "^kernels\|^ *[0-9.]* µs" "$OUT/$name.log" | tail -30
    ;;
bench8b-profile)
    timeout 400 python3 benchmarks/bench_block_8b.py --layers 2 --profile --rounds 1 --budget-s 200 \
        > "$OUT/bench_block_8b_profile.log" 2>&1
    echo "bench_block_8b --layers 2 --profile: exit $?"; grep "^|" "$OUT/bench_block_8b_profile.log"
    ;;
pair)
    pair cuda "$@"
    ;;
pair-cpu)
    pair cpu "$@"
    ;;
train)
    drafters=${1:-dflash,dspark}
    log="$OUT/train_block_drafters_${drafters//,/_}.log"
    timeout 580 python3 scripts/train_block_drafters.py --out "$OUT/demo_heads" --drafters "$drafters" ${TRAIN_ARGS:-} \
        > "$log" 2>&1
    echo "train_block_drafters --drafters $drafters ${TRAIN_ARGS:-}: exit $?"
    grep "^\[\|^greedy\|^stdlib\|^saved" "$log" | tail -40; tail -3 "$log"
    ;;
*)
    echo "usage: bash scripts/gpu_block.sh tests|bench8b [ARGS]|bench8b-profile|pair [greedy|t07] [B ...]|pair-cpu ...|train [dflash|dspark]" >&2
    exit 2
    ;;
esac
