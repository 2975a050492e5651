"""ops.truncation_cut (a request's top-k / top-p / min-p as one logit cut per row) at
B = 256, V = 152064, bf16 logits, every row truncated, against torch.compile of the
sort-based reference (truncation_cut_reference) and one plain read of the logits.

Columns: median microseconds of a CUDA-graph replay (harness.time_us); the floor:
one read of the logits, `logits.amax(-1)` compiled (a single pass, no sort); x
floor; compile(ref): torch.compile(truncation_cut_reference, fullgraph=True), timed
the same way, and how many times slower than the op it is; the rows (of B) whose
cut differs from the compiled reference's (a top-p decision within rounding of its
boundary, kernel.py's docstring; 0 expected with bf16 ties). The logits are random
normal times 3 (a spread like a trained model's); each parameter set applies to
every row at T = 0.7 and 1.0 (greedy rows cost nothing: no pass at all).

    python benchmarks/bench_truncation.py
    python benchmarks/bench_truncation.py --smoke        # CPU, tiny sizes: a check of the script
"""

import argparse
import statistics
import time

import torch
from record import append_table

from specdraft.ops import truncation_cut
from specdraft.ops.sampling.truncation import truncation_cut_reference

# (name, top_k, top_p, min_p); off: 0, 1.0, 0.0.
PARAMS = (
    ("top-k 50", 50, 1.0, 0.0),
    ("top-p 0.9", 0, 0.9, 0.0),
    ("min-p 0.05", 0, 1.0, 0.05),
    ("top-k 20 + top-p 0.9", 20, 0.9, 0.0),
    ("top-k 50 + top-p 0.9 + min-p 0.05", 50, 0.9, 0.05),
)
TEMPERATURES = (0.7, 1.0)


def make_inputs(batch, vocab, temperature, top_k, top_p, min_p, device):
    g = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(batch, vocab, device=device, generator=g) * 3.0).to(torch.bfloat16)
    return (
        logits,
        torch.full((batch,), temperature, device=device),
        torch.full((batch,), top_k, dtype=torch.int32, device=device),
        torch.full((batch,), top_p, device=device),
        torch.full((batch,), min_p, device=device),
    )


def time_us(fn, device) -> float:
    if device == "cuda":
        from harness import time_us as graph_time_us

        return graph_time_us(fn)
    fn()
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def bench(batch, vocab, device):
    compiled_ref = torch.compile(truncation_cut_reference, fullgraph=True, dynamic=False)
    read = torch.compile(lambda x: x.amax(-1), fullgraph=True, dynamic=False)
    table = []
    for temperature in TEMPERATURES:
        for name, top_k, top_p, min_p in PARAMS:
            args = make_inputs(batch, vocab, temperature, top_k, top_p, min_p, device)
            # Rows whose cut differs from the compiled reference's: only a top-p decision
            # within rounding of its boundary may (ops/sampling/truncation/kernel.py).
            differ = int((truncation_cut(*args) != compiled_ref(*args)).sum())
            op_us = time_us(lambda a=args: truncation_cut(*a), device)
            ref_us = time_us(lambda a=args: compiled_ref(*a), device)
            floor_us = time_us(lambda a=args: read(a[0]), device)
            table.append([batch, vocab, f"T = {temperature}", name, op_us, floor_us, f"{op_us / floor_us:.2f}x",
                          ref_us, f"{ref_us / op_us:.2f}x", differ])  # fmt: skip
    return table


def markdown(headers, rows) -> str:
    def cell(v):
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=152_064)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: a check of the script")
    args = parser.parse_args(argv)
    device = "cuda"
    if args.smoke:
        device, args.batch, args.vocab = "cpu", 4, 1000
    elif not torch.cuda.is_available():
        print("bench_truncation needs a CUDA device (or --smoke)")
        return
    headers = ["B", "V", "temperature", "truncation", "op us", "floor us (one read)", "x floor",
               "compile(ref) us", "compile(ref) / op", "rows differing from compile(ref)"]  # fmt: skip
    table = bench(args.batch, args.vocab, device)
    if device == "cuda":
        from harness import device_name, emit

        append_table("truncation", headers, table, config_columns=4, config={"dtype": "bfloat16"})
        emit("bench_truncation", f"{device_name()}; bf16 logits\n\n" + markdown(headers, table))
    else:
        print(f"CPU smoke run; B = {args.batch}, V = {args.vocab}, bf16 logits\n\n" + markdown(headers, table))


if __name__ == "__main__":
    main()
