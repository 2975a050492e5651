import torch, sys
sys.path.insert(0, "benchmarks")
from bench_truncation import make_inputs, PARAMS
from specdraft.ops import truncation_cut
import specdraft.ops.sampling.truncation.op as op
from torch.profiler import profile, ProfilerActivity
for rows in (1, 4):
    for name, k, p, m in (PARAMS[0], PARAMS[1], PARAMS[4]):
        args = make_inputs(256, 152064, 1.0, k, p, m, "cuda", rows)
        for _ in range(3): truncation_cut(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10): truncation_cut(*args)
            torch.cuda.synchronize()
        searched = int((op.split_cut(*args)[1] == 0).sum())
        print(f"== {name} rows {256*rows} searched {searched}")
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" and e.count >= 10:
                print(f"  {e.key[:40]:40s} {e.device_time_total/e.count if hasattr(e,'device_time_total') else e.cuda_time_total/e.count:9.1f} us x{e.count//10}")
