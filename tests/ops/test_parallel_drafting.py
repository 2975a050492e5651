"""new_slot_mapping and extend_queries_by_n against plain-Python specs, their
invariants, and the whole parallel-drafting preparation (expand -> extend -> slots).

Tests marked `kernel` run in every lane; `interpreter` ones compare the kernels with
the references bit for bit.
"""

from dataclasses import replace

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specdraft.ops import copy_and_expand_inputs, extend_queries_by_n, new_slot_mapping
from specdraft.ops.parallel_drafting import extend_queries_by_n_reference, new_slot_mapping_reference
from specdraft.testing import ExpandLayout, expand_layouts

PAD = -1


# ----------------------------------------------------------------- the specs (loops)


def spec_extend(qsl: list[int], seq_lens: list[int], n: int):
    return [q + n * i for i, q in enumerate(qsl)], [s + n for s in seq_lens]


def spec_slot_mapping(layout: ExpandLayout, expanded_qsl, positions, rejected):
    bs, mml = layout.block_size, layout.max_model_len
    slots = [PAD] * len(positions)
    for r in range(layout.num_reqs):
        row = layout.block_table[r]
        for t in range(expanded_qsl[r], expanded_qsl[r + 1]):
            if rejected[t] or positions[t] >= mml:
                continue
            p = min(positions[t], mml - 1)
            slots[t] = row[min(p // bs, len(row) - 1)] * bs + p % bs
    return slots


# -------------------------------------------------------------------------- helpers


def expand_and_extend(layout: ExpandLayout, device, index_dtype=torch.int32):
    t = layout.tensors(device, index_dtype)
    expanded = copy_and_expand_inputs(
        t["target_token_ids"], t["target_positions"], t["next_token_ids"], t["query_start_loc"],
        t["num_rejected_tokens"], num_padding_slots_per_request=layout.num_padding_slots_per_request,
        parallel_drafting_token_id=7, shift_input_ids=layout.shift_input_ids, max_query_len=layout.max_query_len,
    )  # fmt: skip
    extended = extend_queries_by_n(
        t["query_start_loc"], t["seq_lens"], layout.growth, layout.max_query_len, max(layout.seq_lens, default=0)
    )
    return t, expanded, extended


def slots_of(layout, expanded, extended, t, **overrides):
    args = {
        "positions": expanded.positions,
        "is_rejected_token_mask": expanded.is_rejected_token_mask,
        "query_start_loc": extended.query_start_loc,
        "block_table": t["block_table"],
    }
    args.update(overrides)
    return new_slot_mapping(
        args["positions"], args["is_rejected_token_mask"], args["query_start_loc"], args["block_table"],
        block_size=layout.block_size, max_model_len=layout.max_model_len, max_query_len=extended.max_query_len,
    )  # fmt: skip


# Prefill chunks of several token blocks, positions crossing max_model_len, a block
# table one block too narrow (the lookup clamps), padded input.
LONG = ExpandLayout(
    query_start_loc=[0, 4, 304, 308, 498],
    num_tokens=500,
    num_rejected=[2, 0, 0, 0],
    first_positions=[495, 0, 496, 10],
    num_padding_slots_per_request=4,
    shift_input_ids=True,
    block_size=16,
    max_model_len=500,
    block_table=[list(range(r * 31, r * 31 + 31)) for r in range(4)],
)


# --------------------------------------------------------------------- spec tests


@pytest.mark.kernel
@given(
    qsl_lens=st.lists(st.integers(0, 300), max_size=8),
    n=st.integers(0, 9),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    padding=st.integers(0, 2),
)
def test_extend_matches_spec(device, qsl_lens, n, index_dtype, padding):
    qsl = [0]
    for k in qsl_lens:
        qsl.append(qsl[-1] + k)
    seq_lens = [k + 3 * i for i, k in enumerate(qsl_lens)]
    q = torch.tensor(qsl, dtype=index_dtype, device=device)
    s = torch.tensor(seq_lens, dtype=index_dtype, device=device)
    got = extend_queries_by_n(q, s, n, max(qsl_lens, default=0), max(seq_lens, default=0))
    want_q, want_s = spec_extend(qsl, seq_lens, n)
    assert got.query_start_loc.tolist() == want_q and got.seq_lens.tolist() == want_s
    assert got.query_start_loc.dtype == index_dtype and got.seq_lens.dtype == index_dtype
    assert got.max_query_len == max(qsl_lens, default=0) + n and got.max_seq_len == max(seq_lens, default=0) + n
    assert q.tolist() == qsl and s.tolist() == seq_lens, "inputs must not be modified"
    none = extend_queries_by_n(q, s, n)
    assert none.max_query_len is None and none.max_seq_len is None


@pytest.mark.kernel
@given(layout=expand_layouts(), index_dtype=st.sampled_from([torch.int32, torch.int64]))
@example(layout=LONG, index_dtype=torch.int32)
@example(layout=replace(LONG, shift_input_ids=False), index_dtype=torch.int64)
def test_slot_mapping_matches_spec(device, layout, index_dtype):
    t, expanded, extended = expand_and_extend(layout, device, index_dtype)
    got = slots_of(layout, expanded, extended, t)
    want = spec_slot_mapping(
        layout, extended.query_start_loc.tolist(), expanded.positions.tolist(),
        expanded.is_rejected_token_mask.tolist(),
    )  # fmt: skip
    assert got.dtype == torch.int64 and got.tolist() == want


@pytest.mark.kernel
@given(layout=expand_layouts(), seed=st.integers(0, 2**16))
def test_slot_mapping_on_arbitrary_positions(device, layout, seed):
    """Positions not from the expansion (anywhere in [0, 2 * max_model_len)) and a
    random rejected mask, without a block-table-width guarantee."""
    t, expanded, extended = expand_and_extend(layout, device)
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 2 * layout.max_model_len, (layout.num_out,), generator=gen).to(device)
    rejected = (torch.rand(layout.num_out, generator=gen) < 0.2).to(device)
    got = slots_of(layout, expanded, extended, t, positions=positions, is_rejected_token_mask=rejected)
    want = spec_slot_mapping(layout, extended.query_start_loc.tolist(), positions.tolist(), rejected.tolist())
    assert got.tolist() == want
    no_mask = slots_of(layout, expanded, extended, t, positions=positions, is_rejected_token_mask=None)
    want = spec_slot_mapping(layout, extended.query_start_loc.tolist(), positions.tolist(), [False] * layout.num_out)
    assert no_mask.tolist() == want


# ---------------------------------------------------------------- the invariants


@pytest.mark.kernel
@given(layout=expand_layouts())
@example(layout=LONG)
def test_slots_stay_in_own_blocks(device, layout):
    """Stated directly: every slot written is PAD or lies in one of the request's own
    blocks at the position's offset; PAD exactly for rejected slots, positions at or
    past max_model_len and slots past the batch; no two live slots collide."""
    t, expanded, extended = expand_and_extend(layout, device)
    slots = slots_of(layout, expanded, extended, t).tolist()
    qsl = extended.query_start_loc.tolist()
    positions, rejected = expanded.positions.tolist(), expanded.is_rejected_token_mask.tolist()
    bs = layout.block_size
    owner = [None] * layout.num_out
    for r in range(layout.num_reqs):
        for i in range(qsl[r], qsl[r + 1]):
            owner[i] = r
    for i, slot in enumerate(slots):
        should_pad = owner[i] is None or rejected[i] or positions[i] >= layout.max_model_len
        assert (slot == PAD) == should_pad, i
        if slot != PAD:
            assert slot // bs in layout.block_table[owner[i]]
            assert slot % bs == min(positions[i], layout.max_model_len - 1) % bs
    live = [s for s in slots if s != PAD]
    # Distinct positions of one request share a slot only through the width clamp.
    width = len(layout.block_table[0]) if layout.block_table else 1
    clamped = any(p < layout.max_model_len and p // bs >= width for p in positions)
    assert clamped or len(set(live)) == len(live)


@pytest.mark.kernel
@given(layout=expand_layouts())
def test_extended_windows_match_the_expansion(device, layout):
    """The extended query_start_loc delimits exactly the windows copy_and_expand
    wrote: each starts at a non-rejected slot, its sampled slots lie inside it, and
    its last slot is the tail's predecessor."""
    t, expanded, extended = expand_and_extend(layout, device)
    qsl = extended.query_start_loc.tolist()
    p = layout.num_padding_slots_per_request
    new = expanded.new_token_indices.tolist()
    for r in range(layout.num_reqs):
        assert all(qsl[r] <= i < qsl[r + 1] for i in new[r * p : (r + 1) * p])
        assert qsl[r + 1] - qsl[r] == layout.window_lens[r] + layout.growth
    assert qsl[-1] + layout.num_tokens - layout.query_start_loc[-1] == layout.num_out
    assert extended.seq_lens.tolist() == [s + layout.growth for s in layout.seq_lens]


@pytest.mark.kernel
def test_empty_batch_pads_everything(device):
    qsl = torch.zeros(1, dtype=torch.int32, device=device)
    positions = torch.arange(5, device=device)
    block_table = torch.zeros(0, 3, dtype=torch.int32, device=device)
    got = new_slot_mapping(positions, None, qsl, block_table, block_size=4, max_model_len=100)
    assert got.tolist() == [PAD] * 5
    ext = extend_queries_by_n(qsl, torch.zeros(0, dtype=torch.int32, device=device), 3)
    assert ext.query_start_loc.tolist() == [0] and ext.seq_lens.shape == (0,)


@pytest.mark.kernel
def test_strided_block_table(device):
    """A column slice of a wider table (row stride != width) is read correctly."""
    wide = torch.arange(40, dtype=torch.int32, device=device).reshape(2, 20)
    table = wide[:, 5:9]
    qsl = torch.tensor([0, 3, 6], dtype=torch.int32, device=device)
    positions = torch.tensor([0, 5, 15, 2, 9, 100], device=device)
    got = new_slot_mapping(positions, None, qsl, table, block_size=4, max_model_len=14)
    assert got.tolist() == [5 * 4 + 0, 6 * 4 + 1, PAD, 25 * 4 + 2, 27 * 4 + 1, PAD]


# ------------------------------------------------------ the interpreter lane only


@pytest.mark.interpreter
@given(layout=expand_layouts(), seed=st.integers(0, 99))
@example(layout=LONG, seed=0)
def test_interpreted_kernels_equal_references(layout, seed):
    t, expanded, extended = expand_and_extend(layout, "cpu")
    want_q, want_s = extend_queries_by_n_reference(t["query_start_loc"], t["seq_lens"], layout.growth)
    assert torch.equal(extended.query_start_loc, want_q) and torch.equal(extended.seq_lens, want_s)
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 2 * layout.max_model_len, (layout.num_out,), generator=gen)
    for pos, rejected in ((expanded.positions, expanded.is_rejected_token_mask), (positions, None)):
        got = slots_of(layout, expanded, extended, t, positions=pos, is_rejected_token_mask=rejected)
        want = new_slot_mapping_reference(
            pos, rejected, extended.query_start_loc, t["block_table"], layout.block_size, layout.max_model_len
        )
        assert torch.equal(got, want)


# ------------------------------------------------------------------- bad input


def _slot_args():
    return {
        "positions": torch.zeros(10, dtype=torch.int64),
        "is_rejected_token_mask": torch.zeros(10, dtype=torch.bool),
        "query_start_loc": torch.tensor([0, 4, 10], dtype=torch.int32),
        "block_table": torch.zeros(2, 4, dtype=torch.int32),
        "block_size": 16,
        "max_model_len": 64,
        "max_query_len": 6,
    }


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"positions": torch.zeros(10)}, "positions"),
        ({"positions": torch.zeros(3, 10, dtype=torch.int64)}, "positions"),
        ({"is_rejected_token_mask": torch.zeros(10, dtype=torch.int32)}, "is_rejected_token_mask"),
        ({"is_rejected_token_mask": torch.zeros(9, dtype=torch.bool)}, "is_rejected_token_mask"),
        ({"query_start_loc": torch.zeros(0, dtype=torch.int32)}, "query_start_loc"),
        ({"block_table": torch.zeros(3, 4, dtype=torch.int32)}, "block_table"),
        ({"block_table": torch.zeros(2, 0, dtype=torch.int32)}, "block_table"),
        ({"block_table": torch.zeros(8, dtype=torch.int32)}, "block_table"),
        ({"block_table": torch.zeros(2, 4)}, "block_table"),
        ({"block_size": 0}, "block_size"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_query_len": -2}, "max_query_len"),
        ({"block_table": "meta"}, "block_table"),
    ],
)
def test_slot_mapping_bad_input_names_the_argument(change, argument):
    args = _slot_args()
    for key, value in change.items():
        args[key] = args[key].to("meta") if isinstance(value, str) else value
    tensors = [args.pop(k) for k in ("positions", "is_rejected_token_mask", "query_start_loc", "block_table")]
    with pytest.raises(ValueError, match=argument):
        new_slot_mapping(*tensors, **args)


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"query_start_loc": torch.zeros(2, 2, dtype=torch.int32)}, "query_start_loc"),
        ({"seq_lens": torch.zeros(3, dtype=torch.int32)}, "seq_lens"),
        ({"seq_lens": torch.zeros(2)}, "seq_lens"),
        ({"n": -1}, "n"),
        ({"n": 1.5}, "n"),
        ({"max_query_len": -1}, "max_query_len"),
        ({"max_seq_len": "x"}, "max_seq_len"),
    ],
)
def test_extend_bad_input_names_the_argument(change, argument):
    args = {
        "query_start_loc": torch.tensor([0, 2, 5], dtype=torch.int32),
        "seq_lens": torch.tensor([4, 9], dtype=torch.int32),
        "n": 2,
    }
    args.update(change)
    with pytest.raises(ValueError, match=argument):
        extend_queries_by_n(**args)
