"""Parallel-drafting preparation on the GPU: copy_and_expand_inputs,
extend_queries_by_n and new_slot_mapping, each as the Triton op vs the eager
reference vs torch.compile(reference), with one empty Triton kernel launch as the
yardstick (these ops are launch-bound: the target is <= 1.5x the empty kernel at
B <= 64, and never slower than the compiled reference).

    python benchmarks/bench_expand.py
"""

import sys

import torch
from harness import device_name, emit, empty_kernel_us, markdown_table, time_us
from record import append_table

import specdraft.ops.copy_and_expand as ce
import specdraft.ops.parallel_drafting as pd

DRAFTS, SLOTS, PAR_ID = 3, 4, 128_000  # EAGLE K = 3 drafts, parallel drafting with 4 new slots
BLOCK_SIZE, MAX_MODEL_LEN = 16, 8192
BATCHES = (1, 8, 64, 256, 1024)


def make_batch(batch: int, prefill: int = 0, prefill_len: int = 1024):
    """`batch` requests of 1 + DRAFTS tokens (0..DRAFTS rejected), the first
    `prefill` of them prefill chunks of `prefill_len` tokens instead."""
    gen = torch.Generator().manual_seed(batch)
    lens = torch.full((batch,), DRAFTS + 1, dtype=torch.int32)
    lens[:prefill] = prefill_len
    rejected = torch.randint(0, DRAFTS + 1, (batch,), generator=gen, dtype=torch.int32)
    rejected[:prefill] = 0
    qsl = torch.zeros(batch + 1, dtype=torch.int32)
    qsl[1:] = lens.cumsum(0)
    tokens = int(qsl[-1])
    first = torch.randint(0, MAX_MODEL_LEN - prefill_len - 1, (batch,), generator=gen)
    req = torch.repeat_interleave(torch.arange(batch), lens.long())
    positions = first[req] + torch.arange(tokens) - qsl[:-1].long()[req]
    width = MAX_MODEL_LEN // BLOCK_SIZE
    cuda = {"device": "cuda"}
    return {
        "target_token_ids": torch.randint(0, 128_000, (tokens,), generator=gen, dtype=torch.int32).to(**cuda),
        "target_positions": positions.to(**cuda),
        "next_token_ids": torch.randint(0, 128_000, (batch,), generator=gen, dtype=torch.int32).to(**cuda),
        "query_start_loc": qsl.to(**cuda),
        "num_rejected_tokens": rejected.to(**cuda),
        "seq_lens": (first + lens).to(torch.int32).to(**cuda),
        "block_table": torch.randperm(batch * width, generator=gen, dtype=torch.int32).view(batch, width).to(**cuda),
        "max_query_len": int(lens.max()),
    }


def expand_runners(b):
    args = (b["target_token_ids"], b["target_positions"], b["next_token_ids"], b["query_start_loc"],
            b["num_rejected_tokens"])  # fmt: skip
    ref_args = (*args, SLOTS, 0, PAR_ID, True)
    kw = {"num_padding_slots_per_request": SLOTS, "parallel_drafting_token_id": PAR_ID, "shift_input_ids": True}
    return (
        lambda: ce.copy_and_expand_inputs(*args, **kw, max_query_len=b["max_query_len"]),
        lambda ref: ref(*ref_args),
        ce.copy_and_expand_inputs_reference,
    )


def extend_runners(b):
    args = (b["query_start_loc"], b["seq_lens"], SLOTS - 1)
    return (
        lambda: pd.extend_queries_by_n(*args, b["max_query_len"], MAX_MODEL_LEN),
        lambda ref: ref(*args),
        pd.extend_queries_by_n_reference,
    )


def slots_runners(b):
    expanded = ce.copy_and_expand_inputs_reference(
        b["target_token_ids"], b["target_positions"], b["next_token_ids"], b["query_start_loc"],
        b["num_rejected_tokens"], SLOTS, 0, PAR_ID, True,
    )  # fmt: skip
    qsl, _ = pd.extend_queries_by_n_reference(b["query_start_loc"], b["seq_lens"], SLOTS - 1)
    args = (expanded.positions, expanded.is_rejected_token_mask, qsl, b["block_table"])
    kw = {"block_size": BLOCK_SIZE, "max_model_len": MAX_MODEL_LEN, "max_query_len": b["max_query_len"] + SLOTS - 1}
    return (
        lambda: pd.new_slot_mapping(*args, **kw),
        lambda ref: ref(*args, BLOCK_SIZE, MAX_MODEL_LEN),
        pd.new_slot_mapping_reference,
    )


OPS = {
    "copy_and_expand_inputs": expand_runners,
    "extend_queries_by_n": extend_runners,
    "new_slot_mapping": slots_runners,
}


def check_exact(op_out, ref_out):
    def tensors(out):
        return [x for x in (out if isinstance(out, tuple) else (out,)) if isinstance(x, torch.Tensor)]

    for a, b in zip(tensors(op_out), tensors(ref_out), strict=True):
        assert torch.equal(a, b), "Triton and reference differ"


def bench_op(name, make_runners, empty_us):
    compiled_ref = None
    rows = []
    layouts = [(batch, 0) for batch in BATCHES] + [(64, 4)]  # the last: 4 prefill chunks of 1024
    for batch, prefill in layouts:
        b = make_batch(batch, prefill)
        op, call_ref, ref = make_runners(b)
        if compiled_ref is None:  # one dynamic compile serves every batch size
            compiled_ref = torch.compile(ref, fullgraph=True, dynamic=True)
        check_exact(op(), call_ref(ref))
        op_us = time_us(op)
        eager_us = time_us(lambda call_ref=call_ref, ref=ref: call_ref(ref))
        compiled_us = time_us(lambda call_ref=call_ref, fn=compiled_ref: call_ref(fn))
        layout = f"decode 1+{DRAFTS}" if not prefill else f"{prefill} x 1024 prefill + decode"
        tokens = b["target_token_ids"].shape[0]
        rows.append([batch, layout, tokens, op_us, eager_us, compiled_us, empty_us, op_us / empty_us,
                     compiled_us / op_us])  # fmt: skip
        print(name, rows[-1], flush=True)
    headers = ["B", "layout", "T_in", "triton op µs", "eager ref µs", "compile(ref) µs", "empty kernel µs",
               "op / empty", "compile(ref) / op"]  # fmt: skip
    append_table("expand", headers, rows, config_columns=3, config={"op": name})
    return f"### {name}\n\n" + markdown_table(headers, rows)


def main():
    torch._dynamo.config.cache_size_limit = 64
    empty_us = empty_kernel_us()
    tables = [bench_op(name, make, empty_us) for name, make in OPS.items()]
    text = (
        f"Device: {device_name()}; empty Triton kernel: {empty_us:.1f} µs.\n"
        f"P = {SLOTS} new slots per request (shift by one), K = {DRAFTS} drafts, block size {BLOCK_SIZE}, "
        f"max_model_len {MAX_MODEL_LEN}; times are CUDA-graph replays (median).\n\n" + "\n\n".join(tables)
    )
    emit("expand", text)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("bench_expand.py needs a CUDA device")
    main()
