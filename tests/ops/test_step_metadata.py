"""step_metadata against a plain-Python spec, plus its invariants: slots in the
request's own blocks or PAD, k steps = one jump of k, nothing written outside the
declared outputs.

`kernel` tests run in every lane; `interpreter` tests compare the kernel with the
reference bit for bit.
"""

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


def spec_step(layout: StepLayout, rows, seq_lens):
    """One step; rows: position rows (row 0 decides). Returns (rows, clamped, slots, seq_lens)."""
    rows = [list(r) for r in rows]
    clamped = [list(r) for r in rows]
    seq_lens = list(seq_lens)
    slots = [PADDING_SLOT_ID] * layout.num_slots
    bs, mml = layout.block_size, layout.max_model_len
    for b in range(layout.num_reqs):
        p = rows[0][b] + 1
        clamp = p >= mml or p < 0
        for r in range(len(rows)):
            rows[r][b] += 1
            clamped[r][b] = 0 if clamp else rows[r][b]
        if not clamp:
            blocks = layout.block_table[b]
            slots[b] = blocks[min(p // bs, len(blocks) - 1)] * bs + p % bs
        seq_lens[b] = 1 if clamp else min(seq_lens[b] + 1, mml)
    return rows, clamped, slots, seq_lens


# -------------------------------------------------------------------------- helpers


class Buffers:
    """The op's buffers as views into larger sentinel-filled tensors, so a write past
    any view's edge shows up."""

    def __init__(self, layout: StepLayout, device, position_dtype=torch.int64, index_dtype=torch.int32):
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

    def step(self):
        step_metadata(
            self.positions, self.seq_lens, self.block_table, self.slot_mapping, self.clamped,
            block_size=self.layout.block_size, max_model_len=self.layout.max_model_len,
        )  # fmt: skip

    def rows(self, t):
        return t.tolist() if t.dim() == 2 else [t.tolist()]

    def assert_margins_untouched(self):
        for full in (self.pos_full, self.clamped_full, self.seq_full, self.slot_full):
            assert (full[..., -MARGIN:] == SENTINEL).all(), "written outside the declared outputs"


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
    want_rows, want_clamped, want_slots, want_seq = spec_step(layout, layout.position_rows(), layout.seq_lens)
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
    kw = {k: args.pop(k) for k in ("block_size", "max_model_len")}
    step_metadata(*args.values(), **kw)


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


# ------------------------------------------------------ the interpreter lane only


@pytest.mark.interpreter
@given(layout=step_layouts(max_requests=40))
@example(layout=MANY_REQUESTS)
def test_interpreted_kernel_equals_reference(layout):
    kernel, ref = Buffers(layout, "cpu"), Buffers(layout, "cpu")
    kernel.step()
    step_metadata_reference(
        ref.positions, ref.seq_lens, ref.block_table, ref.slot_mapping, ref.clamped,
        layout.block_size, layout.max_model_len,
    )  # fmt: skip
    for a, b in ((kernel.pos_full, ref.pos_full), (kernel.clamped_full, ref.clamped_full),
                 (kernel.seq_full, ref.seq_full), (kernel.slot_full, ref.slot_full)):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=0, atol=0)


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
