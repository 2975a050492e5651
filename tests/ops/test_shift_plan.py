"""shift_plan against a plain-Python spec (specs/shift_and_cache.py), the
interpreted kernel against the reference bit for bit, and bad input named.

`kernel` tests run in every lane; `interpreter` tests only with TRITON_INTERPRET=1.
"""

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specdraft.ops import shift_plan
from specdraft.ops.shift_plan import shift_plan_reference
from specdraft.testing import shift_layouts

from specs.shift_and_cache import LONG_WINDOWS, spec_shift_plan


def assert_bitwise(actual, expected):
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.kernel
@given(
    layout=shift_layouts(),
    mrope=st.booleans(),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
)
@example(layout=LONG_WINDOWS, mrope=True, index_dtype=torch.int32)
def test_shift_plan_matches_spec(device, layout, mrope, index_dtype):
    meta = layout.tensors(device, index_dtype)
    positions = meta["positions"]
    if mrope:  # rows 1, 2 differ from row 0: only row 0 may decide the shift
        positions = torch.stack([positions, positions * 0 + 3, positions + 11])
    inputs = {k: meta[k].clone() for k in ("query_start_loc", "token_indices_to_sample", "seq_lens", "cached_lens")}
    plan = shift_plan(
        meta["query_start_loc"], positions, meta["token_indices_to_sample"], meta["seq_lens"],
        meta["cached_lens"], layout.max_shift,
    )  # fmt: skip
    want = spec_shift_plan(layout)
    for name, got in plan._asdict().items():
        assert got.tolist() == want[name], name
        assert got.dtype == (meta[name].dtype if name != "shift" else index_dtype)
    for name, tensor in inputs.items():
        assert torch.equal(meta[name], tensor), f"{name} must not be modified"


# ------------------------------------------------------ the interpreter lane only


@pytest.mark.interpreter
@given(layout=shift_layouts(), seed=st.integers(0, 2**16))
def test_interpreted_plan_kernel_equals_reference(layout, seed):
    meta = layout.tensors("cpu")
    args = (meta["query_start_loc"], meta["positions"], meta["token_indices_to_sample"], meta["seq_lens"],
            meta["cached_lens"], layout.max_shift)  # fmt: skip
    for got, want in zip(shift_plan(*args), shift_plan_reference(*args), strict=True):
        assert_bitwise(got, want)


# ------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"max_shift": 0}, "max_shift"),
        ({"max_shift": 9}, "max_shift"),
        ({"positions": torch.zeros(2, 3, 6, dtype=torch.int64)}, "positions"),
        ({"positions": torch.zeros(6)}, "positions"),
        ({"seq_lens": torch.zeros(3, dtype=torch.int32)}, "seq_lens"),
    ],
)
def test_plan_bad_input_names_the_argument(kwargs, argument):
    args = {
        "query_start_loc": torch.tensor([0, 2, 5], dtype=torch.int32),
        "positions": torch.arange(6),
        "token_indices_to_sample": None,
        "seq_lens": torch.tensor([4, 9], dtype=torch.int32),
        "cached_lens": torch.tensor([0, 2], dtype=torch.int32),
        "max_shift": 3,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=argument):
        shift_plan(**args)
