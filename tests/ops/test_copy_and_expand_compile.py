"""opcheck for copy_and_expand_inputs, extend_queries_by_n and new_slot_mapping; the
whole parallel-drafting preparation (expand -> extend -> slot mapping) compiled with
fullgraph=True equals eager, with no graph break, and with dynamic=True compiles once
for several batch sizes."""

import pytest
import torch

from specdraft.ops import copy_and_expand_inputs, extend_queries_by_n, new_slot_mapping
from specdraft.testing import CompileCounts, ExpandLayout, fresh_compile

SLOTS, PAR_ID, BLOCK_SIZE, MAX_MODEL_LEN = 3, 31_000, 16, 600
WIDTH = -(-MAX_MODEL_LEN // BLOCK_SIZE)  # 38 columns


def layout_of(batch: int, shift: bool = True) -> ExpandLayout:
    """Decode requests (4 tokens, 0..3 rejected) with a prefill chunk of 130+ tokens
    every fourth request; some windows end right below max_model_len."""
    lens = [130 + b if b % 4 == 1 else 4 for b in range(batch)]
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    return ExpandLayout(
        query_start_loc=qsl,
        num_tokens=qsl[-1] + 2,
        num_rejected=[b % 4 if n == 4 else 0 for b, n in enumerate(lens)],
        first_positions=[(MAX_MODEL_LEN - n) if b % 3 == 0 else 7 * b for b, n in enumerate(lens)],
        num_padding_slots_per_request=SLOTS,
        shift_input_ids=shift,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        block_table=[[b * WIDTH + i for i in range(WIDTH)] for b in range(batch)],
    )


def inputs(layout: ExpandLayout, device) -> dict[str, torch.Tensor]:
    t = layout.tensors(device)
    names = ("target_token_ids", "target_positions", "next_token_ids", "query_start_loc", "num_rejected_tokens",
             "seq_lens", "block_table")  # fmt: skip
    return {k: t[k] for k in names}


def prepare_parallel_drafting(
    target_token_ids, target_positions, next_token_ids, query_start_loc, num_rejected_tokens, seq_lens,
    block_table, max_query_len: int, max_seq_len: int,
):  # fmt: skip
    expanded = copy_and_expand_inputs(
        target_token_ids, target_positions, next_token_ids, query_start_loc, num_rejected_tokens,
        num_padding_slots_per_request=SLOTS, parallel_drafting_token_id=PAR_ID, shift_input_ids=True,
        max_query_len=max_query_len,
    )  # fmt: skip
    extended = extend_queries_by_n(query_start_loc, seq_lens, SLOTS - 1, max_query_len, max_seq_len)
    slot_mapping = new_slot_mapping(
        expanded.positions, expanded.is_rejected_token_mask, extended.query_start_loc, block_table,
        block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN, max_query_len=extended.max_query_len,
    )  # fmt: skip
    return (*expanded, extended.query_start_loc, extended.seq_lens, slot_mapping)


def bounds(layout: ExpandLayout) -> dict[str, int]:
    return {"max_query_len": layout.max_query_len, "max_seq_len": max(layout.seq_lens, default=0)}


def assert_same(eager_out, compiled_out):
    for a, b in zip(eager_out, compiled_out, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_opcheck_every_op(device):
    layout = layout_of(6)
    t = inputs(layout, device)
    for shift in (True, False):
        for rejected in (t["num_rejected_tokens"], None):
            torch.library.opcheck(
                torch.ops.specdraft.copy_and_expand_inputs,
                (t["target_token_ids"], t["target_positions"], t["next_token_ids"], t["query_start_loc"], rejected,
                 SLOTS, 0, PAR_ID, shift, layout.max_query_len),
            )  # fmt: skip
    torch.library.opcheck(torch.ops.specdraft.extend_queries_by_n, (t["query_start_loc"], t["seq_lens"], SLOTS - 1))
    expanded = prepare_parallel_drafting(**t, **bounds(layout))
    positions, rejected, extended_qsl = expanded[1], expanded[2], expanded[6]
    for mask in (rejected, None):
        torch.library.opcheck(
            torch.ops.specdraft.new_slot_mapping,
            (positions, mask, extended_qsl, t["block_table"], BLOCK_SIZE, MAX_MODEL_LEN, layout.max_query_len + 2),
        )


def test_fullgraph_equals_eager_without_graph_breaks(device):
    layout = layout_of(6)
    t = inputs(layout, device)
    eager_out = prepare_parallel_drafting(**t, **bounds(layout))
    compiled = fresh_compile(prepare_parallel_drafting, fullgraph=True)
    with CompileCounts.measure() as counts:
        compiled_out = compiled(**t, **bounds(layout))
    assert_same(eager_out, compiled_out)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1


def test_dynamic_shapes_compile_once_across_batch_sizes(device):
    compiled = fresh_compile(prepare_parallel_drafting, fullgraph=True, dynamic=True)
    with CompileCounts.measure() as counts:
        for batch in (5, 9, 17):  # no size coincides with WIDTH (38) or SLOTS
            layout = layout_of(batch)
            t = inputs(layout, device)
            assert_same(prepare_parallel_drafting(**t, **bounds(layout)), compiled(**t, **bounds(layout)))
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"recompiled: {counts.compiles} graphs for 3 batch sizes"


@pytest.mark.parametrize("batch", [0, 1])
def test_fullgraph_tiny_batches(device, batch):
    layout = layout_of(batch)
    t = inputs(layout, device)
    eager_out = prepare_parallel_drafting(**t, **bounds(layout))
    compiled_out = fresh_compile(prepare_parallel_drafting, fullgraph=True)(**t, **bounds(layout))
    assert_same(eager_out, compiled_out)
