"""ops.budget_keep (budgeted verification's allocation: the best positions of the
whole batch under one token budget, one program, no sort) at B = 1, 8, 64, 256
requests of N = 7 (a chain of K = 7) and N = 64 (a tree of 64 nodes) drafted
positions, the budget half of them; values continuous (no exact ties: the tie
search is skipped) and from products of survivals in {0, 1/4, 1/2, 3/4, 1} (exact
ties at the threshold: the tie search runs).

Columns: median microseconds of a CUDA-graph replay (harness.time_us); x load-store:
the op over one Triton kernel that loads an int32 and stores one (the floor of any
launch that reads its input, harness.load_store_kernel_us); eager ref: the op's torch
reference (two stable argsorts) on the same tensors, timed the same way. The target
(issue 39): at B = 256 the op costs at most 2% of a speculative iteration.

    python benchmarks/bench_budget_keep.py
    python benchmarks/bench_budget_keep.py --smoke        # CPU, the same shapes: a check of the script
"""

import argparse

import torch
from record import append_table
from tables import markdown_table, time_us

from specdraft.ops import budget_keep
from specdraft.ops.budget import budget_keep_reference

SURVIVALS = [0.0, 0.25, 0.5, 0.75, 1.0]


def make_inputs(batch: int, positions: int, values: str, device):
    """values [B, N] (each row a chain of products: never increasing), chain depths,
    budget: half the positions."""
    g = torch.Generator().manual_seed(0)
    if values == "continuous":
        survival = torch.rand(batch, positions, generator=g) * 0.5 + 0.5
    else:
        survival = torch.tensor(SURVIVALS)[torch.randint(1, len(SURVIVALS), (batch, positions), generator=g)]
    depths = torch.arange(positions).expand(batch, positions).contiguous()
    budget = torch.tensor(batch * positions // 2)
    return survival.cumprod(1).to(device), depths.to(device), budget.to(device)


def reference_us(args, device):
    """The torch reference's time, or why it has none (a CUDA graph may refuse to capture it)."""
    try:
        return time_us(lambda: budget_keep_reference(*args), device, cpu_repeats=5)
    except RuntimeError as error:
        return f"failed: {str(error).splitlines()[0][:60]}"


def bench(batches, positions, device):
    floor_us = None
    if device == "cuda":
        from harness import load_store_kernel_us

        floor_us = load_store_kernel_us()
    table = []
    for batch in batches:
        for num_pos in positions:
            for values in ("continuous", "ties"):
                args = make_inputs(batch, num_pos, values, device)
                op_us = time_us(lambda a=args: budget_keep(*a), device, cpu_repeats=5)
                table.append([batch, num_pos, values, int(args[2]), op_us,
                              f"{op_us / floor_us:.1f}x" if floor_us else "n/a", reference_us(args, device)])  # fmt: skip
    return table, floor_us


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--positions", type=int, nargs="+", default=[7, 64], help="N, drafted positions a request")
    parser.add_argument("--smoke", action="store_true", help="CPU, the same shapes: a check of the script")
    args = parser.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("bench_budget_keep needs a CUDA device (or --smoke)")
        return
    headers = ["B", "N", "values", "budget", "op us", "x load-store", "eager ref us"]
    table, floor_us = bench(args.batches, args.positions, device)
    if device == "cuda":
        from harness import device_name, emit

        append_table("budget_keep", headers, table, config_columns=4, config={"depths": "chain"})
        header = f"{device_name()}; load-store kernel {floor_us:.1f} us; chain depths, budget half the positions"
        emit("bench_budget_keep", header + "\n\n" + markdown_table(headers, table))
    else:
        print("CPU smoke run (the op's torch reference on CPU)\n\n" + markdown_table(headers, table))


if __name__ == "__main__":
    main()
