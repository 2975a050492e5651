"""step_metadata against a plain-Python spec, plus its invariants: slots in the
request's own blocks or PAD, k steps = one jump of k, nothing written outside the
declared outputs. M-RoPE: the slot and the clamp follow seq_index, the token's index
in its sequence, however far the compressed rotary rows lag behind it (images), and
rows equal to the index give exactly the 1-D results.

`kernel` tests run in every lane; `interpreter` tests compare the kernel with the
reference bit for bit.
"""

import dataclasses

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specdraft.ops import PADDING_SLOT_ID, step_metadata
from specdraft.ops.step_metadata import step_metadata_reference
from specdraft.testing import StepLayout, check_step_metadata_values, step_layouts

SENTINEL = -777
MARGIN = 3  # extra columns around every buffer view, which must stay untouched

# ----------------------------------------------------------------- the spec (loops)


def spec_step(layout: StepLayout, rows, seq_lens, seq_index=None):
    """One step; rows: position rows; seq_index: the running sequence index (None: 1-D,
    the positions are the index). Returns (rows, clamped, slots, seq_lens, seq_index)."""
    rows = [list(r) for r in rows]
    clamped = [list(r) for r in rows]
    seq_lens = list(seq_lens)
    index = list(rows[0] if seq_index is None else seq_index)
    slots = [PADDING_SLOT_ID] * layout.num_slots
    bs, mml = layout.block_size, layout.max_model_len
    for b in range(layout.num_reqs):
        index[b] += 1
        p = index[b]
        clamp = p >= mml or p < 0
        for r in range(len(rows)):
            rows[r][b] += 1
            clamped[r][b] = 0 if clamp else rows[r][b]
        if not clamp:
            blocks = layout.block_table[b]
            slots[b] = blocks[min(p // bs, len(blocks) - 1)] * bs + p % bs
        seq_lens[b] = 1 if clamp else min(seq_lens[b] + 1, mml)
    return rows, clamped, slots, seq_lens, index


# -------------------------------------------------------------------------- helpers


class Buffers:
    """The op's buffers as views into larger sentinel-filled tensors, so a write past
    any view's edge shows up."""

    def __init__(self, layout: StepLayout, device, position_dtype=torch.int64, index_dtype=torch.int32,
                 seq_index=None):  # fmt: skip
        """seq_index: the M-RoPE running index (default: row 0, a text-only batch)."""
        t = layout.tensors(device, position_dtype, index_dtype)
        b = layout.num_reqs
        rows = t["positions"].shape[0] if t["positions"].dim() == 2 else None
        lead = () if rows is None else (rows,)
        self.pos_full = torch.full((*lead, b + MARGIN), SENTINEL, dtype=position_dtype, device=device)
        self.clamped_full = torch.full_like(self.pos_full, SENTINEL)
        self.pos_full[..., :b] = t["positions"]
        self.positions = self.pos_full[..., :b]
        self.clamped = self.clamped_full[..., :b]
        self.seq_full = torch.full((b + MARGIN,), SENTINEL, dtype=index_dtype, device=device)
        self.seq_full[:b] = t["seq_lens"]
        self.seq_lens = self.seq_full[:b]
        self.slot_full = torch.full((layout.num_slots + MARGIN,), SENTINEL, dtype=torch.int64, device=device)
        self.slot_mapping = self.slot_full[: layout.num_slots]
        self.block_table = t["block_table"]
        self.layout = layout
        self.index_full = self.seq_index = None
        if rows is not None:
            self.index_full = torch.full((b + MARGIN,), SENTINEL, dtype=torch.int64, device=device)
            self.index_full[:b] = torch.tensor(layout.positions if seq_index is None else seq_index, dtype=torch.int64)
            self.seq_index = self.index_full[:b]

    def step(self):
        step_metadata(
            self.positions, self.seq_lens, self.block_table, self.slot_mapping, self.clamped,
            block_size=self.layout.block_size, max_model_len=self.layout.max_model_len, seq_index=self.seq_index,
        )  # fmt: skip

    def spec(self):
        """The spec's step from the buffers' current values."""
        index = None if self.seq_index is None else self.seq_index.tolist()
        return spec_step(self.layout, self.rows(self.positions), self.seq_lens.tolist(), index)

    def rows(self, t):
        return t.tolist() if t.dim() == 2 else [t.tolist()]

    def assert_margins_untouched(self):
        for full in (self.pos_full, self.clamped_full, self.seq_full, self.slot_full, self.index_full):
            assert full is None or (full[..., -MARGIN:] == SENTINEL).all(), "written outside the declared outputs"


# Several programs (128 requests each) and padding rows past the batch.
MANY_REQUESTS = StepLayout(
    positions=[(37 * b) % 70 for b in range(300)],
    seq_lens=[min((37 * b) % 70 + 1, 64) for b in range(300)],
    block_table=[[4 * b + i for i in range(4)] for b in range(300)],
    num_slots=333,
    block_size=16,
    max_model_len=64,
    mrope_offsets=[b % 9 for b in range(300)],
)


# --------------------------------------------------------------------- spec tests


@pytest.mark.kernel
@given(
    layout=step_layouts(),
    position_dtype=st.sampled_from([torch.int64, torch.int32]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
)
@example(layout=MANY_REQUESTS, position_dtype=torch.int64, index_dtype=torch.int32)
def test_step_matches_spec(device, layout, position_dtype, index_dtype):
    buf = Buffers(layout, device, position_dtype, index_dtype)
    table_in = buf.block_table.clone()
    want_rows, want_clamped, want_slots, want_seq, _ = buf.spec()
    buf.step()
    assert buf.rows(buf.positions) == want_rows
    assert buf.rows(buf.clamped) == want_clamped
    assert buf.slot_mapping.tolist() == want_slots  # padding rows past B hold PAD
    assert buf.seq_lens.tolist() == want_seq
    assert torch.equal(buf.block_table, table_in), "block_table must not be written"
    buf.assert_margins_untouched()


@pytest.mark.kernel
@given(layout=step_layouts())
@example(layout=MANY_REQUESTS)
def test_slots_belong_to_own_blocks_or_pad(device, layout):
    buf = Buffers(layout, device)
    buf.step()
    bs = layout.block_size
    first_clamped = buf.clamped[0] if buf.clamped.dim() == 2 else buf.clamped
    for b, slot in enumerate(buf.slot_mapping.tolist()):
        if b >= layout.num_reqs or slot == PADDING_SLOT_ID:
            assert slot == PADDING_SLOT_ID
            assert b >= layout.num_reqs or first_clamped[b].item() == 0
            continue
        assert slot // bs in layout.block_table[b], f"request {b} writes slot {slot} outside its blocks"
        assert slot % bs == first_clamped[b].item() % bs


@pytest.mark.kernel
@given(layout=step_layouts(), k=st.integers(1, 5))
@example(layout=MANY_REQUESTS, k=4)
def test_k_steps_equal_one_jump_of_k(device, layout, k):
    """positions advance by k; the clamp (and hence slot, seq_len) depends on
    row 0 + k alone; seq_lens grow by k, capped, or are 1 once clamped."""
    buf = Buffers(layout, device)
    for _ in range(k):
        buf.step()
    mml, bs = layout.max_model_len, layout.block_size
    want_rows = [[p + k for p in row] for row in layout.position_rows()]
    assert buf.rows(buf.positions) == want_rows
    for b, p0 in enumerate(layout.positions):
        p = p0 + k
        clamp = p >= mml
        assert buf.seq_lens[b].item() == (1 if clamp else min(layout.seq_lens[b] + k, mml))
        assert all(row[b] == (0 if clamp else want_rows[r][b]) for r, row in enumerate(buf.rows(buf.clamped)))
        blocks = layout.block_table[b]
        want_slot = PADDING_SLOT_ID if clamp else blocks[min(p // bs, len(blocks) - 1)] * bs + p % bs
        assert buf.slot_mapping[b].item() == want_slot
    buf.assert_margins_untouched()


@pytest.mark.kernel
def test_negative_positions_are_clamped_to_pad(device):
    # Out of contract, still defined: no block-table read at a negative index.
    layout = StepLayout([-5, 3], [1, 4], [[0, 1], [2, 3]], 2, 4, 8)
    buf = Buffers(layout, device)
    buf.step()
    assert buf.slot_mapping.tolist() == [PADDING_SLOT_ID, 3 * 4 + 0]  # position 4: block 1 of request 1
    assert buf.clamped.tolist() == [0, 4] and buf.positions.tolist() == [-4, 4]
    assert buf.seq_lens.tolist() == [1, 5]


@pytest.mark.kernel
def test_empty_batch_pads_every_slot(device):
    buf = Buffers(StepLayout([], [], [], 5, 16, 64), device)
    buf.step()
    assert buf.slot_mapping.tolist() == [PADDING_SLOT_ID] * 5
    buf.assert_margins_untouched()


# ------------------------------------------------------ M-RoPE: the sequence index


@st.composite
def image_layouts(draw):
    """(M-RoPE layout, seq_index): rows compressed as after images, i.e. the token's
    index in its sequence (seq_len - 1) runs ahead of every rotary row by a per-request
    gap, which may put the index past max_model_len while the rows are far below it."""
    layout = draw(step_layouts(mrope=True))
    gaps = draw(st.lists(st.integers(0, 3 * layout.max_model_len), min_size=layout.num_reqs,
                         max_size=layout.num_reqs))  # fmt: skip
    index = [p + g for p, g in zip(layout.positions, gaps, strict=True)]
    mml = layout.max_model_len
    seq_lens = [min(i + 1, mml) if i + 1 < mml else draw(st.sampled_from([1, mml])) for i in index]
    return StepLayout(layout.positions, seq_lens, layout.block_table, layout.num_slots, layout.block_size, mml,
                      layout.mrope_offsets), index  # fmt: skip


@pytest.mark.kernel
@given(layout=image_layouts(), k=st.integers(1, 4))
def test_mrope_slots_follow_the_sequence_index(device, layout, k):
    """k steps against the spec run on seq_index: slots, clamp and seq_lens never look
    at the rotary rows, which all advance by one per step."""
    layout, index = layout
    buf = Buffers(layout, device, seq_index=index)
    rows, seq_lens = layout.position_rows(), layout.seq_lens
    for _ in range(k):
        rows, want_clamped, want_slots, seq_lens, index = spec_step(layout, rows, seq_lens, index)
        buf.step()
        assert buf.rows(buf.positions) == rows
        assert buf.rows(buf.clamped) == want_clamped
        assert buf.slot_mapping.tolist() == want_slots
        assert buf.seq_lens.tolist() == seq_lens
        assert buf.seq_index.tolist() == index
    buf.assert_margins_untouched()


@pytest.mark.kernel
def test_mrope_probe_writes_the_next_sequence_slots(device):
    """The probe from the issue: temporal rows [110, 210], seq_lens [365, 600],
    arange block tables (256 blocks of 16 per request). The new tokens are the
    365th and 600th of their sequences: slots 365 and 4096 + 600 (row 0 gave 111 and
    4307, slots of earlier tokens)."""
    layout = StepLayout(
        positions=[109, 209], seq_lens=[365, 600], block_table=[list(range(256)), list(range(256, 512))],
        num_slots=2, block_size=16, max_model_len=8192, mrope_offsets=[5, 15],
    )  # fmt: skip
    buf = Buffers(layout, device, seq_index=[364, 599])
    buf.positions.copy_(torch.tensor([[109, 209], [114, 224], [119, 234]]))  # + 1: [[110, 210], [115, 225], ...]
    buf.step()
    assert buf.slot_mapping.tolist() == [365, 4696]
    assert buf.rows(buf.clamped) == [[110, 210], [115, 225], [120, 235]]
    assert buf.seq_lens.tolist() == [366, 601] and buf.seq_index.tolist() == [365, 600]


@pytest.mark.kernel
def test_mrope_clamp_follows_the_sequence_and_persists(device):
    """Row 0 far below max_model_len, the index at it: PAD, position 0, seq_len 1; the
    next step is still clamped (seq_lens alone, reset to 1, would have let it write its
    own block 0 again)."""
    layout = StepLayout([10], [31], [[0, 1, 2, 3]], 1, 8, 32, mrope_offsets=[2])
    buf = Buffers(layout, device, seq_index=[30])
    buf.step()  # index 31: the last slot
    assert buf.slot_mapping.tolist() == [3 * 8 + 7] and buf.seq_lens.tolist() == [32]
    for _ in range(2):
        buf.step()  # index 32, 33: past max_model_len
        assert buf.slot_mapping.tolist() == [PADDING_SLOT_ID]
        assert buf.rows(buf.clamped) == [[0], [0], [0]] and buf.seq_lens.tolist() == [1]
    assert buf.rows(buf.positions) == [[13], [15], [11]] and buf.seq_index.tolist() == [33]


@pytest.mark.kernel
@given(layout=step_layouts(mrope=False), k=st.integers(1, 3))
@example(layout=MANY_REQUESTS, k=3)
def test_mrope_rows_equal_to_the_index_give_the_1d_results(device, layout, k):
    """Three rows, each equal to the 1-D positions, and seq_index = positions: every
    output equals the 1-D op's, clamps included."""
    flat = StepLayout(layout.positions, layout.seq_lens, layout.block_table, layout.num_slots, layout.block_size,
                      layout.max_model_len)  # fmt: skip
    one_d = Buffers(flat, device)
    three = Buffers(StepLayout(*dataclasses.astuple(flat)[:6], mrope_offsets=[0] * flat.num_reqs), device,
                    seq_index=list(flat.positions))  # fmt: skip
    for _ in range(k):
        one_d.step()
        three.step()
        assert three.rows(three.positions) == one_d.rows(one_d.positions) * 3
        assert three.rows(three.clamped) == one_d.rows(one_d.clamped) * 3
        assert three.slot_mapping.tolist() == one_d.slot_mapping.tolist()
        assert three.seq_lens.tolist() == one_d.seq_lens.tolist()
        assert three.seq_index.tolist() == one_d.positions.tolist()


# ------------------------------------------------------------------- bad arguments


def _args(**change):
    args = {
        "positions": torch.tensor([3, 5]),
        "seq_lens": torch.tensor([4, 6], dtype=torch.int32),
        "block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        "slot_mapping": torch.zeros(3, dtype=torch.int64),
        "clamped_positions": torch.zeros(2, dtype=torch.int64),
        "block_size": 4,
        "max_model_len": 8,
    }
    args.update(change)
    return args


def _call(args):
    kw = {k: args.pop(k) for k in ("block_size", "max_model_len", "seq_index") if k in args}
    step_metadata(*args.values(), **kw)


MROPE = {"positions": torch.zeros(3, 2, dtype=torch.int64), "clamped_positions": torch.zeros(3, 2, dtype=torch.int64)}


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"positions": torch.tensor([3.0, 5.0])}, "positions"),
        ({"positions": torch.zeros(2, 2, 2, dtype=torch.int64)}, "positions"),
        ({"positions": torch.zeros(4, 2, dtype=torch.int64)}, "positions"),
        ({"clamped_positions": torch.zeros(2, dtype=torch.int32)}, "clamped_positions"),
        ({"clamped_positions": torch.zeros(3, dtype=torch.int64)}, "clamped_positions"),
        ({"clamped_positions": torch.zeros(4, dtype=torch.int64)[::2]}, "clamped_positions"),
        ({"seq_lens": torch.tensor([4], dtype=torch.int32)}, "seq_lens"),
        ({"block_table": torch.zeros(1, 2, dtype=torch.int32)}, "block_table"),
        ({"block_table": torch.zeros(2, 0, dtype=torch.int32)}, "block_table"),
        ({"block_table": torch.zeros(2, 2)}, "block_table"),
        ({"slot_mapping": torch.zeros(1, dtype=torch.int64)}, "slot_mapping"),
        ({"slot_mapping": torch.zeros(6, dtype=torch.int64)[::2]}, "slot_mapping"),
        ({"block_size": 0}, "block_size"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_model_len": 8.0}, "max_model_len"),
        ({"seq_index": torch.tensor([3])}, "seq_index"),
        ({"seq_index": torch.tensor([3.0, 5.0])}, "seq_index"),
        (MROPE, "seq_index"),  # M-RoPE without the sequence index
    ],
)
def test_bad_arguments_raise_value_error_naming_them(change, argument):
    with pytest.raises(ValueError, match=argument):
        _call(_args(**change))


def test_one_buffer_as_two_outputs_is_refused():
    args = _args()
    args["clamped_positions"] = args["positions"]
    with pytest.raises(ValueError, match="clamped_positions"):
        _call(args)
    args = _args(**MROPE)
    args["seq_index"] = args["seq_lens"]
    with pytest.raises(ValueError, match="seq_index"):
        _call(args)


def test_mrope_with_seq_index_is_accepted():
    _call(_args(**MROPE, seq_index=torch.tensor([3, 5])))


# ------------------------------------------------------ the interpreter lane only


def assert_kernel_step_equals_reference(layout, seq_index=None):
    """One interpreted kernel step against the reference, every buffer bit for bit."""
    kernel, ref = Buffers(layout, "cpu", seq_index=seq_index), Buffers(layout, "cpu", seq_index=seq_index)
    kernel.step()
    step_metadata_reference(
        ref.positions, ref.seq_lens, ref.block_table, ref.slot_mapping, ref.clamped,
        layout.block_size, layout.max_model_len, ref.seq_index,
    )  # fmt: skip
    for a, b in ((kernel.pos_full, ref.pos_full), (kernel.clamped_full, ref.clamped_full),
                 (kernel.seq_full, ref.seq_full), (kernel.slot_full, ref.slot_full),
                 (kernel.index_full, ref.index_full)):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.interpreter
@given(layout=step_layouts(max_requests=40))
@example(layout=MANY_REQUESTS)
def test_interpreted_kernel_equals_reference(layout):
    assert_kernel_step_equals_reference(layout)


@pytest.mark.interpreter
@given(layout=image_layouts())
def test_interpreted_kernel_equals_reference_with_images(layout):
    layout, index = layout
    assert_kernel_step_equals_reference(layout, seq_index=index)


# -------------------------------------------------------- the opt-in value checker


def test_value_checker_accepts_generated_layouts():
    @given(layout=step_layouts())
    def check(layout):
        t = layout.tensors()
        check_step_metadata_values(t["positions"], t["seq_lens"], t["block_table"], layout.max_model_len)

    check()


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"positions": [-1, 2]}, "positions"),
        ({"seq_lens": [0, 2]}, "seq_lens"),
        ({"block_table": [[0, 1], [1, 2]]}, "block_table"),
        ({"block_table": [[0, -1], [2, 3]]}, "block_table"),
    ],
)
def test_value_checker_names_the_argument(change, argument):
    values = {"positions": [1, 2], "seq_lens": [2, 3], "block_table": [[0, 1], [2, 3]]}
    values.update(change)
    t = {k: torch.tensor(v) for k, v in values.items()}
    with pytest.raises(ValueError, match=argument):
        check_step_metadata_values(t["positions"], t["seq_lens"], t["block_table"], 8)
