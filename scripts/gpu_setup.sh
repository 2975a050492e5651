# Sourced by the scripts/gpu_*.sh stage scripts on the device machine: OUT (the device
# tool's output folder, or the default the caller sets first), unbuffered Python, the
# project installed editable without dependencies, the benches' table rows under
# $OUT/results (BENCH_RESULTS, benchmarks/record.py), and the GPU / torch / triton
# versions in $OUT/gpu.txt. The device machine's copy of the tree can carry git
# metadata older than its files (seen: rows recorded as the session's first commit,
# "-dirty"), so name the commit that runs: `BENCH_COMMIT=<sha> bash scripts/gpu_tree.sh ...`.
set -uo pipefail
OUT=${OUT:-$DEFAULT_OUT}
mkdir -p "$OUT"
export BENCH_RESULTS=${BENCH_RESULTS:-$OUT/results}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || python3 -m pip install --no-deps --no-build-isolation -e .
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
[ -n "${BENCH_COMMIT:-}" ] || echo "note: BENCH_COMMIT is not set; bench rows record this copy's git describe" | tee -a "$OUT/gpu.txt"
