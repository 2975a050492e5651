"""Batch-preparation ops on the GPU (prepare_eagle_input, prepare_inputs_padded,
prepare_next_token_padded, step_metadata): the Triton op vs the eager reference vs
torch.compile(reference), with one empty Triton kernel launch as the yardstick (these
ops move a few KB: launch latency is the whole cost). Target: within 1.5x of the empty
kernel at B <= 64, never slower than torch.compile(reference).

    python benchmarks/bench_prepare_and_step.py
"""

import torch
from harness import device_name, emit, empty_kernel_us, load_store_kernel_us, markdown_table, time_us
from record import append_table

import specdraft.ops.prepare_eagle as pe
import specdraft.ops.prepare_inputs as pi

# `specdraft.ops.step_metadata` names the function (re-exported by the package), so
# import from the module rather than binding the module itself.
from specdraft.ops.step_metadata import step_metadata, step_metadata_reference

BATCHES = (1, 8, 64, 256, 1024)
K = 3  # drafts per request: query length K + 1
VOCAB = 32000
BLOCK_SIZE = 16
MAX_MODEL_LEN = 4096
PADDING = 7  # CUDA-graph padding rows of slot_mapping


def rejection_batch(batch: int, gen: torch.Generator) -> dict:
    rejected = torch.randint(0, K + 1, (batch,), generator=gen, dtype=torch.int32)
    qsl = torch.arange(0, batch * (K + 1) + 1, K + 1, dtype=torch.int32)
    sampled = torch.randint(0, VOCAB, (batch, K + 1), generator=gen, dtype=torch.int32)
    cols = torch.arange(K + 1)
    sampled[cols[None, :] >= (K + 1 - rejected)[:, None]] = -1
    return {
        "query_start_loc": qsl.cuda(),
        "num_rejected_tokens": rejected.cuda(),
        "num_kept": int(qsl[-1] - rejected.sum()),
        "cu_num_draft_tokens": torch.cumsum(torch.full((batch,), K, dtype=torch.int32), 0).int().cuda(),
        "valid_sampled_tokens_count": (K + 1 - rejected).cuda(),
        "sampled_token_ids": sampled.cuda(),
        "discard_request_mask": (torch.rand(batch, generator=gen) < 0.05).cuda(),
        "backup_next_token_ids": torch.randint(0, VOCAB, (batch,), generator=gen, dtype=torch.int32).cuda(),
    }


def step_batch(batch: int, gen: torch.Generator) -> dict:
    width = MAX_MODEL_LEN // BLOCK_SIZE
    positions = torch.randint(0, MAX_MODEL_LEN, (batch,), generator=gen)
    positions[::16] = MAX_MODEL_LEN - 2  # some requests reach the limit while timed
    return {
        "positions": positions.cuda(),
        "seq_lens": (positions + 1).int().cuda(),
        "block_table": torch.randperm(batch * width, generator=gen).int().reshape(batch, width).cuda(),
        "slot_mapping": torch.empty(batch + PADDING, dtype=torch.int64, device="cuda"),
        "clamped_positions": torch.empty(batch, dtype=torch.int64, device="cuda"),
    }


def compiled(fn):
    return torch.compile(fn, fullgraph=True, dynamic=True)


COMPILED = {
    name: compiled(ref)
    for name, ref in (
        ("prepare_eagle_input", pe.prepare_eagle_input_reference),
        ("prepare_inputs_padded", pi.prepare_inputs_padded_reference),
        ("prepare_next_token_padded", pi.prepare_next_token_padded_reference),
        ("step_metadata", step_metadata_reference),
    )
}


def runners(name: str, t: dict) -> dict:
    """(triton op, eager reference, compiled reference) thunks for one op."""
    if name == "prepare_eagle_input":
        args = (t["query_start_loc"], t["num_rejected_tokens"], t["num_kept"])
        op, ref = pe.prepare_eagle_input, pe.prepare_eagle_input_reference
    elif name == "prepare_inputs_padded":
        args = (t["cu_num_draft_tokens"], t["valid_sampled_tokens_count"], t["query_start_loc"])
        op, ref = pi.prepare_inputs_padded, pi.prepare_inputs_padded_reference
    elif name == "prepare_next_token_padded":
        args = (t["sampled_token_ids"], t["discard_request_mask"], t["backup_next_token_ids"], VOCAB)
        op, ref = pi.prepare_next_token_padded, pi.prepare_next_token_padded_reference
    else:
        bufs = (t["positions"], t["seq_lens"], t["block_table"], t["slot_mapping"], t["clamped_positions"])
        return {
            "triton op": lambda: step_metadata(*bufs, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN),
            "eager reference": lambda: step_metadata_reference(*bufs, BLOCK_SIZE, MAX_MODEL_LEN),
            "compile(ref)": lambda: COMPILED[name](*bufs, BLOCK_SIZE, MAX_MODEL_LEN),
        }
    return {
        "triton op": lambda: op(*args),
        "eager reference": lambda: ref(*args),
        "compile(ref)": lambda: COMPILED[name](*args),
    }


def check_exact(name: str, batch: int) -> None:
    gen = torch.Generator().manual_seed(batch)
    t = rejection_batch(batch, gen) if name != "step_metadata" else step_batch(batch, gen)
    if name == "step_metadata":
        t2 = {k: v.clone() for k, v in t.items()}
        runners(name, t)["triton op"]()
        runners(name, t2)["eager reference"]()
        same = all(torch.equal(t[k], t2[k]) for k in t)
    else:
        r = runners(name, t)
        same = all(torch.equal(a, b) for a, b in zip(r["triton op"](), r["eager reference"](), strict=True))
    assert same, f"{name}: Triton and reference differ at B={batch}"


def main():
    torch._dynamo.config.cache_size_limit = 64
    empty_us, load_store_us = empty_kernel_us(), load_store_kernel_us()
    headers = ["op", "B", "triton op µs", "eager ref µs", "compile(ref) µs", "op / empty kernel",
               "op / load-store kernel", "compile(ref) / op"]  # fmt: skip
    rows = []
    for name in COMPILED:
        for batch in BATCHES:
            check_exact(name, batch)
            gen = torch.Generator().manual_seed(batch)
            t = rejection_batch(batch, gen) if name != "step_metadata" else step_batch(batch, gen)
            cells = {k: time_us(fn) for k, fn in runners(name, t).items()}
            op_us = cells["triton op"]
            rows.append([name, batch, *cells.values(), op_us / empty_us, op_us / load_store_us,
                         cells["compile(ref)"] / op_us])  # fmt: skip
            print(rows[-1], flush=True)
    text = (
        f"Device: {device_name()}; empty Triton kernel: {empty_us:.1f} µs; a kernel that loads one int32 "
        f"and stores one: {load_store_us:.1f} µs.\n"
        f"K={K} drafts per request, block_size={BLOCK_SIZE}, max_model_len={MAX_MODEL_LEN}, "
        f"{PADDING} padding slots; times are CUDA-graph replays (median).\n\n" + markdown_table(headers, rows)
    )
    emit("prepare_and_step", text)
    append_table("prepare_and_step", headers, rows, config_columns=2)


if __name__ == "__main__":
    main()
