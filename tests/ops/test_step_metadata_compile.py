"""opcheck for step_metadata (1-D and M-RoPE positions, the latter with seq_index);
several draft steps compiled with fullgraph=True equal eager (all written buffers),
with no graph break, and with dynamic=True compile once for several batch sizes."""

import pytest
import torch

from specdraft.ops import step_metadata
from specdraft.testing import CompileCounts, fresh_compile

BLOCK_SIZE = 16
MAX_MODEL_LEN = 64  # block table width 4
STEPS = 3


def buffers(batch: int, device, mrope: bool, padding: int = 2) -> dict:
    """Positions spread over [0, 70): some requests clamp during the steps."""
    pos = (torch.arange(batch) * 37) % 70
    return {
        "positions": (torch.stack([pos, pos + 5, pos + 9]) if mrope else pos).to(device),
        "seq_lens": (pos + 1).clamp(max=MAX_MODEL_LEN).to(torch.int32).to(device),
        "block_table": torch.randperm(batch * 4, generator=torch.Generator().manual_seed(batch))
        .to(torch.int32)
        .reshape(batch, 4)
        .to(device),
        "slot_mapping": torch.full((batch + padding,), 12345, dtype=torch.int64, device=device),
        "clamped_positions": torch.full((3, batch) if mrope else (batch,), 12345, dtype=torch.int64, device=device),
        # M-RoPE: the sequence index runs 40 ahead of the temporal row (an image before)
        "seq_index": (pos + 40).to(device) if mrope else None,
    }


def draft_steps(positions, seq_lens, block_table, slot_mapping, clamped_positions, seq_index, block_size: int,
                max_model_len: int):  # fmt: skip
    for _ in range(STEPS):
        step_metadata(positions, seq_lens, block_table, slot_mapping, clamped_positions,
                      block_size=block_size, max_model_len=max_model_len, seq_index=seq_index)  # fmt: skip


def clone_all(d):
    return {k: None if v is None else v.clone() for k, v in d.items()}


def assert_same(eager, compiled):
    for k in eager:
        if eager[k] is not None:
            torch.testing.assert_close(compiled[k], eager[k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("mrope", [False, True])
def test_opcheck(device, mrope):
    b = buffers(6, device, mrope)
    seq_index = b.pop("seq_index")
    if seq_index is None:
        torch.library.opcheck(torch.ops.specdraft.step_metadata, (*b.values(), BLOCK_SIZE, MAX_MODEL_LEN))
    else:
        op = torch.ops.specdraft.step_metadata_indexed
        torch.library.opcheck(op, (*b.values(), BLOCK_SIZE, MAX_MODEL_LEN, seq_index))


def test_fullgraph_equals_eager_without_graph_breaks(device):
    eager = buffers(10, device, mrope=True)
    compiled_bufs = clone_all(eager)
    draft_steps(**eager, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN)
    compiled = fresh_compile(draft_steps, fullgraph=True)
    with CompileCounts.measure() as counts:
        compiled(**compiled_bufs, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN)
    assert_same(eager, compiled_bufs)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1


def test_dynamic_shapes_compile_once_across_batch_sizes(device):
    compiled = fresh_compile(draft_steps, fullgraph=True, dynamic=True)
    with CompileCounts.measure() as counts:
        for batch in (5, 9, 17):  # B, B + padding never equal the table width (4)
            eager = buffers(batch, device, mrope=False)
            compiled_bufs = clone_all(eager)
            draft_steps(**eager, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN)
            compiled(**compiled_bufs, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN)
            assert_same(eager, compiled_bufs)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"recompiled: {counts.compiles} graphs for 3 batch sizes"
