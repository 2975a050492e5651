"""ops.markov_block_sample (DSpark's Markov head over a drafted block, one op) at the
Qwen3-8B shape DeepSpec's config names (V = 151936, r = 256, S = 7, H = 4096, bf16
weights), B = 1 and 8, each kind, greedy and T = 0.7, against its floor and the
plain torch loop.

Columns: median microseconds of a CUDA-graph replay (harness.time_us); the floor:
reading W2 ([V, r] bf16, 78 MB) once per step, S times, at the rate of a
device-to-device copy (harness.copy_bandwidth_gbs, read + written bytes per second);
x floor; the plain loop: the op's torch reference (S steps of embedding, matmul,
sampling) run eagerly on the same tensors, timed the same way.

    python benchmarks/bench_markov_block.py
    python benchmarks/bench_markov_block.py --smoke        # CPU, tiny sizes: a check of the script
"""

import argparse

import torch
from record import append_table
from tables import markdown_table, time_us

from specdraft.ops import markov_block_sample
from specdraft.ops.markov_block import MARKOV_KINDS, markov_block_sample_reference


def make_inputs(batch: int, steps: int, vocab: int, rank: int, hidden: int, kind: str, temperature: float, device):
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, generator=g) * scale).to(torch.bfloat16)

    args = (
        randn(batch, steps, vocab, scale=3.0),
        torch.randint(0, vocab, (batch,), device=device, generator=g),
        randn(vocab, rank, scale=0.05),
        randn(vocab, rank, scale=0.05),
        torch.full((batch,), temperature, device=device),
        torch.arange(batch, device=device),
        torch.full((batch,), 100, device=device),
    )
    kwargs = {"kind": kind, "hidden_part": None, "latent_weight": None}
    if kind != "vanilla":
        outputs, inputs = (rank, rank) if kind == "gated" else (3 * rank, 2 * rank)
        kwargs["hidden_part"] = randn(batch, steps, outputs).float()
        kwargs["latent_weight"] = randn(outputs, inputs + hidden, scale=0.05)[:, :inputs]
    return args, kwargs


def plain_loop_us(args, kwargs, device):
    """The torch reference's time, or why it has none (a CUDA graph may refuse to capture it)."""
    try:
        return time_us(
            lambda: markov_block_sample_reference(*args, kwargs["kind"], kwargs["hidden_part"],
                                                  kwargs["latent_weight"], 0),
            device,
        )  # fmt: skip
    except RuntimeError as error:
        return f"failed: {str(error).splitlines()[0][:60]}"


def bench(batches, steps, vocab, rank, hidden, device):
    copy_gbs = None
    if device == "cuda":
        from harness import copy_bandwidth_gbs

        copy_gbs = copy_bandwidth_gbs()
    floor_us = steps * vocab * rank * 2 / (copy_gbs * 1e9) * 1e6 if copy_gbs else None
    table = []
    for batch in batches:
        for kind in MARKOV_KINDS:
            for temperature in (0.0, 0.7):
                args, kwargs = make_inputs(batch, steps, vocab, rank, hidden, kind, temperature, device)
                op_us = time_us(lambda a=args, k=kwargs: markov_block_sample(*a, **k), device)
                ref_us = plain_loop_us(args, kwargs, device)
                table.append([batch, kind, "greedy" if temperature == 0 else f"T = {temperature}", op_us,
                              floor_us if floor_us else "n/a", f"{op_us / floor_us:.2f}x" if floor_us else "n/a",
                              ref_us])  # fmt: skip
    return table, copy_gbs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: a check of the script")
    args = parser.parse_args(argv)
    steps, vocab, rank, hidden = 7, 151936, 256, 4096
    device = "cuda"
    if args.smoke:
        device, vocab, rank, hidden, args.batches = "cpu", 1000, 16, 32, [1, 2]
    elif not torch.cuda.is_available():
        print("bench_markov_block needs a CUDA device (or --smoke)")
        return
    headers = ["B", "kind", "sampling", "op us", "floor us (W2 read S times)", "x floor", "plain loop us"]
    table, copy_gbs = bench(args.batches, steps, vocab, rank, hidden, device)
    if device == "cuda":
        from harness import device_name, emit

        config = {"S": steps, "V": vocab, "r": rank, "H": hidden, "dtype": "bfloat16"}
        append_table("markov_block", headers, table, config_columns=3, config=config)
        header = f"{device_name()}; copy {copy_gbs:.0f} GB/s; S = {steps}, V = {vocab}, r = {rank}, bf16 weights"
        emit("bench_markov_block", header + "\n\n" + markdown_table(headers, table))
    else:
        print(f"CPU smoke run; S = {steps}, V = {vocab}, r = {rank}\n\n" + markdown_table(headers, table))


if __name__ == "__main__":
    main()
