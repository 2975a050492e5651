"""Bad input to the shift-and-cache wrappers: a ValueError naming the argument,
raised from shapes/dtypes alone, before any launch (dst stays untouched)."""

import pytest
import torch

from specdraft.ops import shift_and_cache_1d, shift_and_cache_hidden


def good_1d(b=2, t=6, m=3):
    return {
        "src": torch.arange(t, dtype=torch.int32),
        "dst": torch.full((t,), -1, dtype=torch.int32),
        "cache": torch.zeros(b, m, dtype=torch.int32),
        "query_start_loc": torch.tensor([0, 2, 5], dtype=torch.int32),
        "token_indices_to_sample": torch.tensor([1, 4], dtype=torch.int32),
        "shift": torch.tensor([0, 1], dtype=torch.int32),
        "cached_lens": torch.tensor([0, 2], dtype=torch.int32),
    }


def good_hidden():
    args = good_1d()
    args["src"] = torch.randn(6, 8)
    args["dst"] = torch.full((6, 8), -1.0)
    args["cache"] = torch.zeros(2, 3, 8)
    return args


BAD_1D = [
    ("src", lambda a: a["src"].float(), "src"),
    ("dst", lambda a: a["dst"].long(), "dst"),
    ("dst", lambda a: a["dst"][:5], "dst"),
    ("cache", lambda a: a["cache"].long(), "cache"),
    ("cache", lambda a: torch.zeros(2, 6, dtype=torch.int32)[:, ::2], "cache"),  # non-contiguous
    ("cache", lambda a: torch.zeros(3, 3, dtype=torch.int32), "cache"),  # wrong B
    ("cache", lambda a: torch.zeros(2, 9, dtype=torch.int32), "max_shift"),  # MAX_SHIFT > 8
    ("cache", lambda a: torch.zeros(2, 0, dtype=torch.int32), "max_shift"),
    ("cache", lambda a: torch.zeros(2, 3, 1, dtype=torch.int32), "cache"),  # wrong rank
    ("query_start_loc", lambda a: a["query_start_loc"].float(), "query_start_loc"),
    ("query_start_loc", lambda a: a["query_start_loc"][None], "query_start_loc"),
    ("shift", lambda a: a["shift"][:1], "shift"),  # mismatched length
    ("cached_lens", lambda a: a["cached_lens"].to(torch.int16), "cached_lens"),
    ("token_indices_to_sample", lambda a: torch.tensor([1, 4, 5], dtype=torch.int32), "token_indices_to_sample"),
    ("src", lambda a: a["dst"], "dst"),  # src is dst
    ("src", lambda a: torch.arange(18, dtype=torch.int32).view(3, 6), "cache"),  # rows without row cache
]


@pytest.mark.parametrize("field, make_bad, argument", BAD_1D)
def test_1d_bad_input_names_the_argument(field, make_bad, argument):
    args = good_1d()
    args[field] = make_bad(args)
    dst_before = args["dst"].clone()
    with pytest.raises(ValueError, match=argument):
        shift_and_cache_1d(**args)
    assert torch.equal(args["dst"], dst_before)


BAD_HIDDEN = [
    ("src", lambda a: a["src"].double(), "src"),
    ("src", lambda a: a["src"][:, 0], "src"),  # rank
    ("cache", lambda a: torch.zeros(2, 3, 7), "cache"),  # hidden mismatch
    ("cache", lambda a: a["cache"].half(), "cache"),
    ("dst", lambda a: a["dst"].t().contiguous().t(), "dst"),  # non-contiguous
    ("shift", lambda a: a["shift"].float(), "shift"),
]


@pytest.mark.parametrize("field, make_bad, argument", BAD_HIDDEN)
def test_hidden_bad_input_names_the_argument(field, make_bad, argument):
    args = good_hidden()
    args[field] = make_bad(args)
    with pytest.raises(ValueError, match=argument):
        shift_and_cache_hidden(**args)


def test_bad_max_query_len():
    with pytest.raises(ValueError, match="max_query_len"):
        shift_and_cache_1d(**good_1d(), max_query_len=-1)


@pytest.mark.cuda  # a device mismatch needs a second device type
def test_device_mismatch_names_the_argument():
    args = good_1d()
    args["cache"] = args["cache"].cuda()
    with pytest.raises(ValueError, match="cache"):
        shift_and_cache_1d(**args)


def test_meta_device_mismatch_names_the_argument():
    # A second device type exists everywhere: 'meta'. The check reads devices only.
    args = good_1d()
    args["shift"] = args["shift"].to("meta")
    with pytest.raises(ValueError, match="shift"):
        shift_and_cache_1d(**args)
