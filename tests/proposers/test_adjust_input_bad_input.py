"""adjust_input's bad input: shape and dtype mistakes name adjust_input's own
arguments in both modes (not the shift ops' src / dst / cache); checked mode refuses
out-of-contract values by name; unchecked, a negative window start writes nothing
outside the outputs and the cache (guard rows around the cache survive)."""

import dataclasses

import pytest
import torch

import specdraft
from specdraft import ShiftCache, adjust_input


def inputs():
    """Two requests, windows [0, 4) and [4, 6), positions 12.. and 3.., sampling at
    rows 1 and 5 (request 0's last two rows were rejected), with cached tails."""
    cache = ShiftCache.zeros(2, 2, 4, dtype=torch.float32, slot_mapping=False)
    cache.token_ids.copy_(torch.tensor([[3, 4], [9, 9]]))
    cache.positions.copy_(torch.tensor([[10, 11], [1, 2]]))
    cache.cached_lens.copy_(torch.tensor([2, 0], dtype=torch.int32))
    args = {
        "token_ids": torch.tensor([5, 6, 7, 8, 1, 2], dtype=torch.int32),
        "positions": torch.tensor([12, 13, 14, 15, 3, 4]),
        "hidden_states": torch.arange(24, dtype=torch.float32).view(6, 4),
        "query_start_loc": torch.tensor([0, 4, 6], dtype=torch.int32),
        "seq_lens": torch.tensor([16, 5], dtype=torch.int32),
        "cache": cache,
        "token_indices_to_sample": torch.tensor([1, 5], dtype=torch.int32),
        "max_query_len": 4,
    }
    return args


FREE = [
    ("hidden_states", lambda a: {"hidden_states": a["hidden_states"].double()}, r"^hidden_states must have dtype"),
    ("cache.hidden_states", lambda a: {"hidden_states": torch.zeros(6, 8)},
     r"^cache.hidden_states must have shape \(2, 2, 8\)"),
    ("cache.token_ids", lambda a: {"token_ids": a["token_ids"].long()}, r"^cache.token_ids must have dtype in \(int64\)"),
    ("positions", lambda a: {"positions": a["positions"][:5]}, r"^positions must have shape \(6,\) or \(any, 6\)"),
    ("seq_lens", lambda a: {"seq_lens": a["seq_lens"][:1]}, r"^seq_lens must have shape \(2,\)"),
    ("slot_mapping", lambda a: {"slot_mapping": torch.zeros(6, dtype=torch.int64)}, r"^slot_mapping must be given exactly"),
    ("max_query_len", lambda a: {"max_query_len": torch.tensor(4)}, r"^max_query_len must be an int"),
]  # fmt: skip


@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize(("name", "change", "match"), FREE, ids=[f[0] for f in FREE])
def test_shapes_and_dtypes_name_adjust_inputs_arguments(name, change, match, checked):
    args = inputs()
    args.update(change(args))
    with specdraft.checked(checked), pytest.raises(ValueError, match=match):
        adjust_input(**args)


VALUES = [
    ("token_indices_to_sample", {"token_indices_to_sample": torch.tensor([4, 5], dtype=torch.int32)},
     r"^token_indices_to_sample\[0\] = 4 is outside its window \[0, 4\)"),
    ("query_start_loc", {"query_start_loc": torch.tensor([-2, 4, 6], dtype=torch.int32)},
     r"^query_start_loc\[0\] = -2: query_start_loc must start at 0"),
    ("seq_lens", {"seq_lens": torch.tensor([3, 5], dtype=torch.int32)},
     r"^seq_lens\[0\] = 3 is shorter than request 0's window of 4 tokens"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "change", "match"), VALUES, ids=[v[0] for v in VALUES])
def test_checked_mode_names_the_value(name, change, match):
    args = {**inputs(), **change}
    before = args["cache"].token_ids.clone()
    with specdraft.checked(), pytest.raises(ValueError, match=match):
        adjust_input(**args)
    assert torch.equal(args["cache"].token_ids, before)  # refused before anything ran


def test_negative_window_start_stays_inside_the_buffers():
    """query_start_loc[0] = -2 (out of contract): the outputs keep their shapes, rows
    the clipped windows do not cover are copied unchanged, and the cache rows around
    the batch's two (guard rows of a larger cache) keep their values."""
    args = {**inputs(), "query_start_loc": torch.tensor([-2, 4, 6], dtype=torch.int32)}
    cache = args["cache"]
    big = ShiftCache.zeros(4, 2, 4, dtype=torch.float32, slot_mapping=False)
    big.token_ids.fill_(-77)
    big.token_ids[1:3] = cache.token_ids
    big.cached_lens[1:3] = cache.cached_lens
    rows = dataclasses.replace(
        big, token_ids=big.token_ids[1:3], positions=big.positions[1:3], hidden_states=big.hidden_states[1:3],
        cached_lens=big.cached_lens[1:3],
    )  # fmt: skip
    out = adjust_input(**{**args, "cache": rows})
    assert out.token_ids.shape == (6,) and out.hidden_states.shape == (6, 4)
    assert big.token_ids[0].tolist() == [-77, -77] and big.token_ids[3].tolist() == [-77, -77]
    assert out.token_ids[4:].tolist() == [1, 2]  # request 1 did not move (empty tail cache)
