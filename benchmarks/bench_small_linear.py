"""fp32 linears at few rows on CUDA: cuBLAS (what F.linear compiles to) against the
reduction form `models.linear` takes inside a compile (issue 41's point 5: the demo
pair's verify forward at 6-16 rows ran a 37 µs FFMA GEMM per projection).

The demo pair's projection shapes (in -> out: the target's q / k / v / o, gate / up,
down and lm_head; the EAGLE-3 head's q / k / v over 2H and its fc over 3H), at 1-16
rows, each form compiled alone (fullgraph, static shapes) and timed as CUDA-graph
replays (median µs), with the empty-kernel floor beside them and the largest
difference from a float64 product, for both forms. Rows go to the `small_linear`
table (benchmarks/record.py).

    python3 benchmarks/bench_small_linear.py
    python3 benchmarks/bench_small_linear.py --rows 1 8 --shapes 256x768
"""

import argparse
import sys

import torch
from harness import compiled, device_name, empty_kernel_us, time_us
from record import append_rows

from specdraft.models.linear import linear_as_reduction

SHAPES = ["256x256", "256x128", "256x768", "768x256", "512x256"]
ROWS = [1, 4, 8, 16]


def measured(fn, x, weight) -> tuple[float, float]:
    """fn(x, weight)'s CUDA-graph median µs and its largest difference from float64."""
    want = x.double() @ weight.double().T
    return time_us(lambda: fn(x, weight)), float((fn(x, weight).double() - want).abs().max())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=ROWS)
    parser.add_argument("--shapes", nargs="+", default=SHAPES, help="IN x OUT")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    floor = empty_kernel_us()
    name = device_name()
    print(f"{name} (torch {torch.__version__}); fp32, compiled alone, CUDA-graph medians in µs; "
          f"empty kernel {floor:.1f} µs\n")  # fmt: skip
    print(
        "| in x out | rows | cuBLAS µs | reduction µs | cuBLAS / reduction | max error cuBLAS | max error reduction |"
    )
    print("|---|---|---|---|---|---|---|")
    rows = []
    for shape in args.shapes:
        features, out = (int(v) for v in shape.split("x"))
        weight = torch.randn(out, features, device="cuda") / features**0.5
        for num_rows in args.rows:
            x = torch.randn(num_rows, features, device="cuda")
            # A compile per shape (static shapes); lambdas of one loop share a code object,
            # so reset Dynamo's cache rather than meet its recompile limit.
            torch._dynamo.reset()
            blas = compiled(lambda x, w: torch.nn.functional.linear(x, w))
            reduction = compiled(lambda x, w: linear_as_reduction(x, w, None))
            blas_us, blas_error = measured(blas, x, weight)
            reduction_us, reduction_error = measured(reduction, x, weight)
            print(f"| {shape} | {num_rows} | {blas_us:.1f} | {reduction_us:.1f} | {blas_us / reduction_us:.2f} | "
                  f"{blas_error:.1e} | {reduction_error:.1e} |", flush=True)  # fmt: skip
            rows.append(({"in": features, "out": out, "rows": num_rows, "dtype": "float32"},
                         {"blas_us": blas_us, "reduction_us": reduction_us, "empty_kernel_us": floor,
                          "blas_max_error": blas_error, "reduction_max_error": reduction_error}))  # fmt: skip
    append_rows("small_linear", rows, device=name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
