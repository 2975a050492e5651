"""Where truncation_cut's time goes on CUDA (issue 40), printed, not recorded: for each
of bench_truncation.py's parameter sets (B = 256, V = 152k, bf16, T = 0.7 and 1.0),
each kernel's mean device time (torch.profiler) and the rows left to kernel.py's
per-row search; then the cut's CUDA-graph time over a sweep of op.py's launch
constants given as NAME=v1,v2 arguments (each value alone, the others at their
defaults), with the rows whose cut differs from the exact reference where any do. A tool for choosing those constants; the benches' tables are the record.

    python3 scripts/profile_truncation.py
    python3 scripts/profile_truncation.py MAXIMA_GROUP=1,2,4,8 KEYS=2,64
"""

import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_truncation import PARAMS, TEMPERATURES, make_inputs  # noqa: E402
from tables import time_us  # noqa: E402

import specdraft.ops.sampling.truncation.op as launch  # noqa: E402
from specdraft.ops import truncation_cut  # noqa: E402
from specdraft.ops.sampling.truncation import truncation_cut_reference  # noqa: E402

BATCH, VOCAB, CALLS = 256, 152_064, 20


def kernel_times(args) -> dict[str, float]:
    """Mean device µs a call of each kernel the cut launches."""
    truncation_cut(*args)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(CALLS):
            truncation_cut(*args)
        torch.cuda.synchronize()
    times = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name.split("(")[0][:40]] += event.device_time / CALLS
    return dict(times)


def profile() -> None:
    for temperature in TEMPERATURES:
        for name, top_k, top_p, min_p in PARAMS:
            args = make_inputs(BATCH, VOCAB, temperature, top_k, top_p, min_p, "cuda")
            searched = int((launch.split_cut(*args)[1] == 0).sum())
            times = kernel_times(args)
            total = sum(times.values())
            parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(times.items(), key=lambda kv: -kv[1]))
            print(f"T = {temperature}, {name}: {total:.1f} us of kernels, {searched} rows searched | {parts}")


def sweep(settings: list[str]) -> None:
    for setting in settings:
        attr, values = setting.split("=")
        default = getattr(launch, attr)
        for value in (int(v) for v in values.split(",")):
            setattr(launch, attr, value)
            cells = []
            for temperature in TEMPERATURES:
                for name, top_k, top_p, min_p in PARAMS:
                    args = make_inputs(BATCH, VOCAB, temperature, top_k, top_p, min_p, "cuda")
                    us = time_us(lambda a=args: truncation_cut(*a), "cuda")
                    differ = int((truncation_cut(*args) != truncation_cut_reference(*args)).sum())
                    cells.append(f"T{temperature} {name}: {us:.1f}" + (f" ({differ} rows differ)" if differ else ""))
            print(f"{attr} = {value}: " + "; ".join(cells))
        setattr(launch, attr, default)


if __name__ == "__main__":
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(__doc__)
    elif not torch.cuda.is_available():
        print("profile_truncation.py needs a CUDA device")
    else:
        profile()
        sweep(sys.argv[1:])
