"""opcheck for every shift-and-cache op; the whole adjust-input step compiled with
fullgraph=True equals eager, with no graph break, and with dynamic=True compiles
once for several batch sizes."""

import pytest
import torch

from specdraft.ops import shift_and_cache_1d, shift_and_cache_hidden, shift_plan
from specdraft.testing import CompileCounts, ShiftLayout, fresh_compile

LAYOUT = ShiftLayout(
    query_start_loc=[0, 3, 3, 300, 304],
    num_tokens=306,
    max_shift=3,
    cached_lens=[2, 0, 3, 1],
    shift=[1, 0, 3, 1],
    token_indices_to_sample=[1, 2, 298, 302],
    first_positions=[0, 0, 40, 900],
    seq_lens=[3, 0, 337, 904],
)


def layout_of(batch: int) -> ShiftLayout:
    """A batch of `batch` requests of varied window lengths (some several blocks)."""
    lens = [(7 * b) % 11 + (260 if b % 4 == 1 else 1) for b in range(batch)]
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    cached = [b % 4 for b in range(batch)]
    return ShiftLayout(
        query_start_loc=qsl,
        num_tokens=qsl[-1] + 2,
        max_shift=3,
        cached_lens=cached,
        shift=[min(c, 1) for c in cached],
        token_indices_to_sample=[qsl[b + 1] - 1 - (b % 2) for b in range(batch)],
        first_positions=[5 * b for b in range(batch)],
        seq_lens=[5 * b + lens[b] for b in range(batch)],
    )


def inputs(layout: ShiftLayout, device, hidden=40):
    gen = torch.Generator().manual_seed(0)
    meta = layout.tensors(device)
    b, m, t = layout.num_reqs, layout.max_shift, layout.num_tokens
    return {
        "token_ids": torch.randint(0, 1000, (t,), generator=gen, dtype=torch.int32).to(device),
        "positions": meta["positions"],
        "hidden_states": torch.randn(t, hidden, generator=gen).to(device),
        "query_start_loc": meta["query_start_loc"],
        "token_indices_to_sample": meta["token_indices_to_sample"],
        "seq_lens": meta["seq_lens"],
        "cached_lens": meta["cached_lens"],
        "cached_token_ids": torch.randint(0, 1000, (b, m), generator=gen, dtype=torch.int32).to(device),
        "cached_positions": torch.randint(0, 1000, (b, m), generator=gen).to(device),
        "cached_hidden_states": torch.randn(b, m, hidden, generator=gen).to(device),
    }


def adjust_input(
    token_ids, positions, hidden_states, query_start_loc, token_indices_to_sample, seq_lens,
    cached_lens, cached_token_ids, cached_positions, cached_hidden_states, max_query_len: int,
):  # fmt: skip
    plan = shift_plan(query_start_loc, positions, token_indices_to_sample, seq_lens, cached_lens, 3)
    out_ids, out_pos, out_hidden = token_ids.clone(), positions.clone(), hidden_states.clone()
    args = (query_start_loc, plan.token_indices_to_sample, plan.shift, cached_lens, max_query_len)
    shift_and_cache_1d(token_ids, out_ids, cached_token_ids, *args)
    shift_and_cache_1d(positions, out_pos, cached_positions, *args)
    shift_and_cache_hidden(hidden_states, out_hidden, cached_hidden_states, *args)
    cached_lens.copy_(plan.cached_lens)
    return out_ids, out_pos, out_hidden, plan.token_indices_to_sample, plan.seq_lens


def clone_all(d):
    return {k: v.clone() for k, v in d.items()}


def assert_same(eager_in, eager_out, compiled_in, compiled_out):
    for a, b in zip(eager_out, compiled_out, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    for k in eager_in:  # the in-place cache updates agree too
        torch.testing.assert_close(compiled_in[k], eager_in[k], rtol=0, atol=0, msg=k)


def test_opcheck_every_op(device):
    t = inputs(LAYOUT, device)
    meta = LAYOUT.tensors(device)
    args = (meta["query_start_loc"], meta["token_indices_to_sample"], meta["shift"], meta["cached_lens"])
    torch.library.opcheck(
        torch.ops.specdraft.shift_plan,
        (meta["query_start_loc"], meta["positions"], meta["token_indices_to_sample"], meta["seq_lens"],
         meta["cached_lens"], 3),
    )  # fmt: skip
    torch.library.opcheck(
        torch.ops.specdraft.shift_and_cache_1d,
        (t["token_ids"], torch.zeros_like(t["token_ids"]), t["cached_token_ids"], *args, LAYOUT.max_query_len),
    )
    mrope = torch.stack([t["positions"]] * 3)
    torch.library.opcheck(
        torch.ops.specdraft.shift_and_cache_1d,
        (mrope, torch.zeros_like(mrope), torch.stack([t["cached_positions"]] * 3), *args, LAYOUT.max_query_len),
    )
    torch.library.opcheck(
        torch.ops.specdraft.shift_and_cache_hidden,
        (t["hidden_states"], torch.zeros_like(t["hidden_states"]), t["cached_hidden_states"], *args, 297),
    )


def test_fullgraph_equals_eager_without_graph_breaks(device):
    eager_in = inputs(LAYOUT, device)
    compiled_in = clone_all(eager_in)
    eager_out = adjust_input(**eager_in, max_query_len=LAYOUT.max_query_len)
    compiled = fresh_compile(adjust_input, fullgraph=True)
    with CompileCounts.measure() as counts:
        compiled_out = compiled(**compiled_in, max_query_len=LAYOUT.max_query_len)
    assert_same(eager_in, eager_out, compiled_in, compiled_out)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1


def test_dynamic_shapes_compile_once_across_batch_sizes(device):
    compiled = fresh_compile(adjust_input, fullgraph=True, dynamic=True)
    with CompileCounts.measure() as counts:
        for batch in (5, 9, 17):  # none equal to MAX_SHIFT (3): duck sizing would tie them
            layout = layout_of(batch)
            eager_in = inputs(layout, device)
            compiled_in = clone_all(eager_in)
            eager_out = adjust_input(**eager_in, max_query_len=layout.max_query_len)
            compiled_out = compiled(**compiled_in, max_query_len=layout.max_query_len)
            assert_same(eager_in, eager_out, compiled_in, compiled_out)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"recompiled: {counts.compiles} graphs for 3 batch sizes"


@pytest.mark.parametrize("batch", [0, 1])
def test_fullgraph_tiny_batches(device, batch):
    layout = layout_of(batch)
    eager_in = inputs(layout, device)
    compiled_in = clone_all(eager_in)
    eager_out = adjust_input(**eager_in, max_query_len=layout.max_query_len)
    compiled_out = fresh_compile(adjust_input, fullgraph=True)(**compiled_in, max_query_len=layout.max_query_len)
    assert_same(eager_in, eager_out, compiled_in, compiled_out)
