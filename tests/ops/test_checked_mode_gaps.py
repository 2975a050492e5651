"""The last malformed op inputs (issue 27): under checked mode each raises a
ValueError naming its argument; unchecked, the op still runs, keeps its documented
behaviour and writes nothing outside its buffers.

1. draft_sample with negative positions;
2. rejection_sample whose draft_probs give a sampled row's drafted token zero
   probability (an all-zero row included);
3. prepare_eagle_input with num_tokens below the kept total;
4. prepare_next_token_padded with sampled ids >= vocab or negative other than -1;
5. step_metadata whose block table is too narrow for the next position;
6. new_slot_mapping with the same narrow table.
"""

import pytest
import torch

from specdraft import checked, ops

V = 16


def draft_sample_negative_positions(device):
    logits = torch.randn(2, V, device=device)
    temperature = torch.tensor([1.0, 0.0], device=device)
    seeds = torch.tensor([1, 2], device=device)
    positions = torch.tensor([3, -5], device=device)
    return lambda: ops.draft_sample(logits, temperature, seeds, positions)


def rejection_zero_probability(device, all_zero: bool):
    draft_tokens = torch.tensor([[3, 4], [5, -1]], device=device)
    num_draft = torch.tensor([2, 1], device=device)
    probs = torch.full((2, 2, V), 1.0 / V, device=device)
    if all_zero:
        probs[1, 0] = 0.0
    else:
        probs[0, 1, 4] = 0.0  # the drafted token of a sampled row
    target = torch.randn(2, 3, V, device=device)
    temperature = torch.tensor([0.8, 1.0], device=device)
    seeds, positions = torch.tensor([7, 8], device=device), torch.tensor([10, 20], device=device)
    return lambda: ops.rejection_sample(draft_tokens, num_draft, probs, target, temperature, seeds, positions)


def prepare_eagle_short_num_tokens(device):
    cu = torch.tensor([0, 3, 7, 9], dtype=torch.int32, device=device)
    rejected = torch.tensor([0, 0, 0], dtype=torch.int32, device=device)
    return lambda: ops.prepare_eagle_input(cu, rejected, 3)


def next_token_bad_ids(device, bad: int):
    sampled = torch.tensor([[1, 2, -1], [3, bad, -1]], dtype=torch.int32, device=device)
    discard = torch.tensor([False, False], device=device)
    backup = torch.tensor([5, 6], dtype=torch.int32, device=device)
    return lambda: ops.prepare_next_token_padded(sampled, discard, backup, V)


def narrow_table(device):
    # Width 2 with block size 16 reaches position 31; the next token is at 101.
    return torch.tensor([[4, 9]], dtype=torch.int32, device=device)


def step_metadata_narrow_table(device):
    positions = torch.tensor([100], device=device)
    seq_lens = torch.tensor([101], dtype=torch.int32, device=device)
    slots = torch.full((1,), -7, dtype=torch.int64, device=device)
    clamped = torch.empty_like(positions)
    table = narrow_table(device)

    def call():
        ops.step_metadata(positions.clone(), seq_lens.clone(), table, slots, clamped, block_size=16, max_model_len=4096)
        return slots

    return call


def new_slot_mapping_narrow_table(device):
    positions = torch.tensor([99, 100], device=device)
    qsl = torch.tensor([0, 2], dtype=torch.int32, device=device)
    table = narrow_table(device)
    return lambda: ops.new_slot_mapping(positions, None, qsl, table, block_size=16, max_model_len=4096)


CASES = {
    "draft_sample negative positions": (draft_sample_negative_positions, "positions"),
    "rejection_sample zero q at the drafted token": (lambda d: rejection_zero_probability(d, False), "draft_probs"),
    "rejection_sample all-zero q row": (lambda d: rejection_zero_probability(d, True), "draft_probs"),
    "prepare_eagle_input num_tokens below the kept total": (prepare_eagle_short_num_tokens, "num_tokens"),
    "prepare_next_token_padded id >= vocab": (lambda d: next_token_bad_ids(d, V), "sampled_token_ids"),
    "prepare_next_token_padded id -2": (lambda d: next_token_bad_ids(d, -2), "sampled_token_ids"),
    "step_metadata narrow block table": (step_metadata_narrow_table, "block_table"),
    "new_slot_mapping narrow block table": (new_slot_mapping_narrow_table, "block_table"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_checked_mode_names_the_argument(case, device):
    make, argument = CASES[case]
    call = make(device)
    with checked(), pytest.raises(ValueError, match=f"^{argument}"):
        call()


@pytest.mark.parametrize("case", list(CASES))
def test_unchecked_mode_runs(case, device):
    make, _ = CASES[case]
    make(device)()


def test_unchecked_narrow_table_clamps_to_the_last_column(device):
    """The documented clamp: a position past the table takes its slot from the
    table's last block (block 9: slot 9 * 16 + 101 % 16)."""
    assert step_metadata_narrow_table(device)().tolist() == [9 * 16 + 101 % 16]
    assert new_slot_mapping_narrow_table(device)().tolist() == [9 * 16 + 99 % 16, 9 * 16 + 100 % 16]


def test_valid_neighbours_pass_checked_mode(device):
    """The same calls one step inside the rules run under checked mode."""
    with checked():
        ops.prepare_eagle_input(
            torch.tensor([0, 3, 7, 9], dtype=torch.int32, device=device),
            torch.tensor([0, 0, 0], dtype=torch.int32, device=device), 9,
        )  # fmt: skip
        next_token_bad_ids(device, V - 1)()
        draft_probs_ok = torch.full((2, 2, V), 1.0 / V, device=device)
        ops.rejection_sample(
            torch.tensor([[3, 4], [5, -1]], device=device), torch.tensor([2, 1], device=device), draft_probs_ok,
            torch.randn(2, 3, V, device=device), torch.tensor([0.8, 0.0], device=device),
            torch.tensor([7, 8], device=device), torch.tensor([10, 20], device=device),
        )  # fmt: skip
