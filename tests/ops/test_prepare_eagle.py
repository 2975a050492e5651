"""prepare_eagle_input against a plain-Python spec (specs/prepare_inputs.py), plus its
invariants; `interpreter` tests compare the kernel with the reference bit for bit."""

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specdraft.ops import prepare_eagle_input
from specdraft.ops.prepare_eagle import prepare_eagle_input_reference
from specdraft.testing import rejection_layouts

from specs.prepare_inputs import MANY_REQUESTS, spec_prepare_eagle_input

# -------------------------------------------------------------- prepare_eagle_input


@pytest.mark.kernel
@given(
    layout=rejection_layouts(),
    extra=st.one_of(st.just(0), st.integers(0, 70)),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
)
@example(layout=MANY_REQUESTS, extra=3, index_dtype=torch.int32)
def test_prepare_eagle_input_matches_spec(device, layout, extra, index_dtype):
    meta = layout.tensors(device, index_dtype)
    inputs = {k: v.clone() for k, v in meta.items()}
    num_tokens = layout.num_kept_tokens + extra
    out = prepare_eagle_input(meta["query_start_loc"], meta["num_rejected_tokens"], num_tokens)

    want_cu, want_idx = spec_prepare_eagle_input(layout.query_start_loc, layout.num_rejected_tokens, num_tokens)
    assert out.cu_num_tokens.tolist() == want_cu
    assert out.token_indices.tolist() == want_idx
    assert out.cu_num_tokens.dtype == out.token_indices.dtype == index_dtype
    for k, v in inputs.items():
        assert torch.equal(meta[k], v), f"{k} must not be modified"


@pytest.mark.kernel
@given(layout=rejection_layouts())
@example(layout=MANY_REQUESTS)
def test_prepare_eagle_input_invariants(device, layout):
    """Stated directly: runs sum to the output size, each run is its request's window
    prefix of kept length, in order."""
    meta = layout.tensors(device)
    total = layout.num_kept_tokens
    cu, idx = prepare_eagle_input(meta["query_start_loc"], meta["num_rejected_tokens"], total)
    cu, idx, qsl = cu.tolist(), idx.tolist(), layout.query_start_loc
    assert cu[-1] == len(idx) == total
    for b in range(layout.num_reqs):
        run = idx[cu[b] : cu[b + 1]]
        assert len(run) == layout.query_lens[b] - layout.num_rejected_tokens[b]
        assert all(qsl[b] <= i < qsl[b + 1] for i in run), "index outside its request's window"
        assert run == sorted(set(run)) and (not run or run[0] == qsl[b])


@pytest.mark.kernel
def test_prepare_eagle_input_empty_batch_and_zero_rows(device):
    out = prepare_eagle_input(torch.zeros(1, dtype=torch.int32, device=device), torch.zeros(0, dtype=torch.int32,
                              device=device), 5)  # fmt: skip
    assert out.cu_num_tokens.tolist() == [0] and out.token_indices.tolist() == [0] * 5
    qsl = torch.tensor([0, 2, 4], dtype=torch.int32, device=device)
    out = prepare_eagle_input(qsl, torch.tensor([2, 2], dtype=torch.int32, device=device), 0)
    assert out.cu_num_tokens.tolist() == [0, 0, 0] and out.token_indices.shape == (0,)


# ------------------------------------------------------------------- bad arguments


def _i(values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype)


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda: prepare_eagle_input(_i([0, 2]).float(), _i([0]), 2), "cu_target_query_lens"),
        (lambda: prepare_eagle_input(_i([0, 2]), _i([0, 0]), 2), "num_rejected_tokens"),
        (lambda: prepare_eagle_input(_i([0, 2]), _i([0]), -1), "num_tokens"),
        (lambda: prepare_eagle_input(_i([0, 2]), _i([0]), 2.0), "num_tokens"),
        (lambda: prepare_eagle_input(_i([]), _i([]), 2), "cu_target_query_lens"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()


# ------------------------------------------------------ the interpreter lane only


def assert_bitwise(actual, expected):
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


@pytest.mark.interpreter
@given(layout=rejection_layouts(max_requests=40), extra=st.integers(0, 70))
@example(layout=MANY_REQUESTS, extra=130)
def test_interpreted_kernel_equals_reference(layout, extra):
    meta = layout.tensors("cpu")
    args = (meta["query_start_loc"], meta["num_rejected_tokens"], layout.num_kept_tokens + extra)
    for got, want in zip(prepare_eagle_input(*args), prepare_eagle_input_reference(*args), strict=True):
        assert_bitwise(got, want)
