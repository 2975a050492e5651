"""draft_sample and rejection_sample: Triton op vs eager reference vs
torch.compile(reference), at V = 32k and 152k, B in {1, 8, 64, 256}, K = 3.

GB/s counts the bytes an implementation must read, once: draft, the logits
[B, V]; rejection, the K draft rows of target logits (acceptance statistics) plus
the emitting row of target logits and of fp32 draft probs (the residual race).
The yardstick is harness.copy_bandwidth_gbs() (read + write of a 1 GiB copy).
Target: at V = 152k, B = 256 the logits are read at >= 70 % of copy bandwidth.
Random requests (T = 1) throughout: the greedy path skips the hash and is cheaper.

    python benchmarks/bench_sampling.py           # about a minute
    python benchmarks/bench_sampling.py --tiles   # also draft_sample's tile sweep
"""

import importlib
import sys

import torch
from harness import copy_bandwidth_gbs, device_name, emit, empty_kernel_us, gbs, markdown_table, time_us
from record import append_table

from specdraft.ops import draft_sample, rejection_sample
from specdraft.ops.sampling.draft import draft_sample_reference, draft_sample_store_reference
from specdraft.ops.sampling.rejection import rejection_sample_reference

# One compiled function per reference for all sizes: automatic dynamic shapes
# recompile once after the first new size instead of once per (V, B).
ref_draft = torch.compile(draft_sample_reference, fullgraph=True)
ref_store = torch.compile(draft_sample_store_reference, fullgraph=True)
ref_rejection = torch.compile(rejection_sample_reference, fullgraph=True)

VOCABS = (32_000, 152_064)
BATCHES = (1, 8, 64, 256)
NUM_SPEC = 3


def request_params(batch: int):
    return (
        torch.ones(batch, device="cuda"),
        torch.arange(batch, device="cuda") * 7919 + 1,
        torch.arange(batch, device="cuda") * 5,
    )


def bench_draft(copy_gbs: float) -> str:
    rows = []
    for vocab in VOCABS:
        for batch in BATCHES:
            logits = torch.randn(batch, vocab, device="cuda", dtype=torch.bfloat16)
            temperature, seeds, positions = request_params(batch)
            probs = torch.zeros(batch, NUM_SPEC, vocab, device="cuda")
            step = torch.tensor(1, device="cuda")
            args = (logits, temperature, seeds, positions)
            op_us = time_us(lambda a=args: draft_sample(*a))
            eager_us = time_us(lambda a=args: draft_sample_reference(*a))
            comp_us = time_us(lambda a=args: ref_draft(*a))
            store_us = time_us(lambda a=args, p=probs, s=step: draft_sample(*a, probs_out=p, step=s))
            store_comp_us = time_us(lambda a=args, p=probs, s=step: ref_store(*a, p, s, 0, True))
            read = logits.numel() * logits.element_size()
            rows.append([
                vocab, batch, op_us, eager_us, comp_us, gbs(read, op_us), 100 * gbs(read, op_us) / copy_gbs,
                store_us, store_comp_us,
            ])  # fmt: skip
    headers = ["V", "B", "op µs", "eager ref µs", "compiled ref µs", "op GB/s (logits read)", "% of copy",
               "op + probs write µs", "compiled ref + probs µs"]  # fmt: skip
    append_table("sampling", headers, rows, config_columns=2, config={"op": "draft_sample"})
    return "### draft_sample (bf16 logits, T = 1)\n\n" + markdown_table(headers, rows)


def bench_rejection(copy_gbs: float) -> str:
    rows = []
    for vocab in VOCABS:
        for batch in BATCHES:
            gen_logits = torch.randn(batch, NUM_SPEC + 1, vocab, device="cuda", dtype=torch.bfloat16)
            draft_probs = torch.softmax(torch.randn(batch, NUM_SPEC, vocab, device="cuda"), -1)
            drafts = torch.randint(0, vocab, (batch, NUM_SPEC), device="cuda")
            num_draft = torch.full((batch,), NUM_SPEC, device="cuda")
            temperature, seeds, positions = request_params(batch)
            args = (drafts, num_draft, draft_probs, gen_logits, temperature, seeds, positions)
            op_us = time_us(lambda a=args: rejection_sample(*a))
            eager_us = time_us(lambda a=args: rejection_sample_reference(*a))
            comp_us = time_us(lambda a=args: ref_rejection(*a))
            one_hot_us = time_us(lambda a=args: rejection_sample(a[0], a[1], None, *a[3:]))
            # What the op must read: the K draft rows of target logits (softmax statistics
            # for the acceptance tests), then the emitting row of target logits and of draft
            # probs (the residual race). Not the bonus row nor the other draft-prob rows.
            row = batch * vocab
            read = NUM_SPEC * row * 2 + row * (2 + 4)
            rows.append([vocab, batch, op_us, eager_us, comp_us, gbs(read, op_us), 100 * gbs(read, op_us) / copy_gbs,
                         one_hot_us])  # fmt: skip
    headers = ["V", "B", "op µs", "eager ref µs", "compiled ref µs", "op GB/s (bytes it must read)", "% of copy",
               "op, one-hot q µs"]  # fmt: skip
    append_table("sampling", headers, rows, config_columns=2, config={"op": "rejection_sample"})
    return f"### rejection_sample (K = {NUM_SPEC}, bf16 target logits, fp32 draft probs, T = 1)\n\n" + markdown_table(
        headers, rows
    )


def sweep_draft_tiles(copy_gbs: float) -> str:
    """draft_sample's tile shape at V = 152k, B = 256: tokens per program (CHUNK_V),
    per loop iteration (DRAFT_BLOCK_V) and warps; the module defaults are the first row."""
    ds = importlib.import_module("specdraft.ops.sampling.draft.op")  # the module whose launcher reads these tiles
    defaults = (ds.CHUNK_V, ds.DRAFT_BLOCK_V, ds.DRAFT_NUM_WARPS)
    configs = [defaults, (8192, 2048, 8), (16384, 2048, 8), (16384, 1024, 4), (8192, 512, 4)]
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randn(256, 152_064, device="cuda", dtype=dtype)
        read = logits.numel() * logits.element_size()
        for greedy in (False, True):
            temperature, seeds, positions = request_params(256)
            args = (logits, temperature * (0 if greedy else 1), seeds, positions)
            for config in configs if not greedy else configs[:1]:
                ds.CHUNK_V, ds.DRAFT_BLOCK_V, ds.DRAFT_NUM_WARPS = config
                us = time_us(lambda a=args: draft_sample(*a))
                rows.append([str(dtype).removeprefix("torch."), "greedy" if greedy else "T = 1", *config, us,
                             100 * gbs(read, us) / copy_gbs])  # fmt: skip
        ds.CHUNK_V, ds.DRAFT_BLOCK_V, ds.DRAFT_NUM_WARPS = defaults
    headers = ["logits", "sampling", "CHUNK_V", "DRAFT_BLOCK_V", "num_warps", "µs", "% of copy"]
    append_table("sampling_tiles", headers, rows, config_columns=5, config={"V": 152_064, "B": 256})
    return "### draft_sample tiles (V = 152064, B = 256)\n\n" + markdown_table(headers, rows)


def main() -> None:
    if not torch.cuda.is_available():
        print("bench_sampling needs a CUDA device")
        return
    copy_gbs = copy_bandwidth_gbs()
    if "--tiles" in sys.argv:
        emit("bench_sampling_tiles", sweep_draft_tiles(copy_gbs))
    header = (
        f"{device_name()}; copy bandwidth {copy_gbs:.0f} GB/s; empty kernel {empty_kernel_us():.1f} µs; "
        "times are CUDA-graph medians"
    )
    emit("bench_sampling", "\n\n".join([header, bench_draft(copy_gbs), bench_rejection(copy_gbs)]))


if __name__ == "__main__":
    main()
