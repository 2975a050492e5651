#!/usr/bin/env bash
# The eval CLI at the 8B shape on CUDA, one GPU then `torchrun` over every GPU of the
# machine (issue 29; issue 24's eval CLI point), logs and a table under $OUT:
#   bash scripts/gpu_eval_scaling.sh
# 1. scripts/eval_8b_shards.py writes an 8B-shaped EAGLE-3 head and 8 shards of two
#    2048-token sequences (random bf16 target outputs, 128k vocabulary);
# 2. one process on GPU 0 (a cold Inductor cache: its first shard holds the compile);
# 3. torchrun --nproc-per-node NGPU (the cache now warm);
# 4. scripts/compare_eval_runs.py: equal sums, tokens/s, scaling efficiency.
DEFAULT_OUT=/tmp/gpu_eval_scaling
source "$(dirname "$0")/gpu_setup.sh"
NGPU=$(nvidia-smi -L | wc -l)
DATA=/tmp/e8b
ARGS=(--device cuda --steps 7)

timeout 150 python3 scripts/eval_8b_shards.py "$DATA" --sequences 2 2 2 2 2 2 2 2 2>&1 | tee "$OUT/shards.log"
du -sh "$DATA/shards" | tee -a "$OUT/shards.log"
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m specdraft.eval "$DATA/head" "$DATA/shards" "${ARGS[@]}" \
    --json "$OUT/eval_1gpu.json" 2>&1 | tee "$OUT/eval_1gpu.log" | grep -v "it/s\]$"
timeout 200 torchrun --standalone --nproc-per-node "$NGPU" -m specdraft.eval "$DATA/head" "$DATA/shards" "${ARGS[@]}" \
    --json "$OUT/eval_${NGPU}gpu.json" 2>&1 | tee "$OUT/eval_${NGPU}gpu.log" | grep -v "it/s\]$"
python3 scripts/compare_eval_runs.py "$OUT/eval_1gpu.json" "$OUT/eval_${NGPU}gpu.json" | tee "$OUT/table.md"
