"""draft_sample and rejection_sample: Triton op vs eager reference vs
torch.compile(reference), at V = 32k and 152k, B in {1, 8, 64, 256}, K = 3.

GB/s counts the bytes of logits read once (draft: B*V, rejection: B*(K+1)*V
target logits plus B*K*V draft probs), the floor any implementation pays; the
yardstick is harness.copy_bandwidth_gbs() (read + write of a 1 GiB copy). Target:
draft_sample at V = 152k, B = 256 reaches >= 70 % of copy bandwidth. Random
requests (T = 1) throughout: the greedy path skips the hash and is cheaper.

Run on a GPU machine: python benchmarks/bench_sampling.py  (about a minute).
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import copy_bandwidth_gbs, device_name, emit, empty_kernel_us, gbs, markdown_table, time_us  # noqa: E402

from specdraft.ops import draft_sample, rejection_sample  # noqa: E402
from specdraft.ops.draft_sample import draft_sample_reference, draft_sample_store_reference  # noqa: E402
from specdraft.ops.rejection_sample import rejection_sample_reference  # noqa: E402

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
            read = gen_logits.numel() * gen_logits.element_size() + draft_probs.numel() * 4
            rows.append([vocab, batch, op_us, eager_us, comp_us, gbs(read, op_us), 100 * gbs(read, op_us) / copy_gbs,
                         one_hot_us])  # fmt: skip
    headers = ["V", "B", "op µs", "eager ref µs", "compiled ref µs", "op GB/s (inputs read)", "% of copy",
               "op, one-hot q µs"]  # fmt: skip
    return f"### rejection_sample (K = {NUM_SPEC}, bf16 target logits, fp32 draft probs, T = 1)\n\n" + markdown_table(
        headers, rows
    )


def main() -> None:
    if not torch.cuda.is_available():
        print("bench_sampling needs a CUDA device")
        return
    copy_gbs = copy_bandwidth_gbs()
    header = (
        f"{device_name()}; copy bandwidth {copy_gbs:.0f} GB/s; empty kernel {empty_kernel_us():.1f} µs; "
        "times are CUDA-graph medians"
    )
    emit("bench_sampling", "\n\n".join([header, bench_draft(copy_gbs), bench_rejection(copy_gbs)]))


if __name__ == "__main__":
    main()
