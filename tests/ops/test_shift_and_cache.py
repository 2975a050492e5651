"""shift_and_cache_{1d,hidden} against a plain-Python spec (specs/shift_and_cache.py).

Tests marked `kernel` run in every lane: on CPU they check the reference, under
TRITON_INTERPRET=1 the Triton kernel (the op routes CPU tensors to it there), with
SPECDRAFT_DEVICE=cuda the kernel on the GPU. Tests marked `interpreter` compare the
kernel with the reference directly, bit for bit.
"""

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specdraft.ops import shift_and_cache_1d, shift_and_cache_hidden
from specdraft.ops.shift_and_cache.hidden import shift_and_cache_hidden_reference
from specdraft.ops.shift_and_cache.one_d import shift_and_cache_1d_reference
from specdraft.testing import ShiftLayout, check_shift_and_cache_values, shift_layouts

from specs.shift_and_cache import LONG_WINDOWS, spec_shift_and_cache

SENTINEL = -777


# -------------------------------------------------------------------------- helpers


def make_1d_case(layout: ShiftLayout, rows: int | None, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    lead = () if rows is None else (rows,)
    src = torch.randint(0, 1 << 20, (*lead, layout.num_tokens), generator=gen, dtype=dtype)
    cache = torch.randint(0, 1 << 20, (*lead, layout.num_reqs, layout.max_shift), generator=gen, dtype=dtype)
    dst = torch.full_like(src, SENTINEL)
    return src.to(device), dst.to(device), cache.to(device)


def make_hidden_case(layout: ShiftLayout, hidden: int, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randn(layout.num_tokens, hidden, generator=gen).to(dtype)
    cache = torch.randn(layout.num_reqs, layout.max_shift, hidden, generator=gen).to(dtype)
    dst = torch.full_like(src, float("nan"))
    return src.to(device), dst.to(device), cache.to(device)


def run_1d(layout, src, dst, cache, device, index_dtype=torch.int32):
    meta = layout.tensors(device, index_dtype)
    shift_and_cache_1d(
        src, dst, cache, meta["query_start_loc"], meta["token_indices_to_sample"], meta["shift"],
        meta["cached_lens"], max_query_len=layout.max_query_len,
    )  # fmt: skip


def run_hidden(layout, src, dst, cache, device):
    meta = layout.tensors(device)
    shift_and_cache_hidden(
        src, dst, cache, meta["query_start_loc"], meta["token_indices_to_sample"], meta["shift"],
        meta["cached_lens"], max_query_len=layout.max_query_len,
    )  # fmt: skip


def assert_bitwise(actual, expected):
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=0, atol=0, equal_nan=True)


# --------------------------------------------------------------------- spec tests


@pytest.mark.kernel
@given(
    layout=shift_layouts(),
    rows=st.sampled_from([None, 3]),
    dtype=st.sampled_from([torch.int32, torch.int64]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 2**16),
)
@example(layout=LONG_WINDOWS, rows=None, dtype=torch.int64, index_dtype=torch.int32, seed=0)
@example(layout=LONG_WINDOWS, rows=3, dtype=torch.int32, index_dtype=torch.int64, seed=1)
def test_1d_matches_spec(device, layout, rows, dtype, index_dtype, seed):
    src, dst, cache = make_1d_case(layout, rows, dtype, device, seed)
    src_in, cache_in = src.clone(), cache.clone()
    run_1d(layout, src, dst, cache, device, index_dtype)

    assert torch.equal(src, src_in), "src must not be written"
    for r in range(1 if rows is None else rows):
        pick = (lambda t, r=r: t) if rows is None else (lambda t, r=r: t[r])
        want_dst, want_cache = spec_shift_and_cache(
            pick(src_in).tolist(),
            [SENTINEL] * layout.num_tokens,
            pick(cache_in).tolist(),
            layout,
            0,
        )
        assert pick(dst).tolist() == want_dst  # sentinels survive outside every window
        assert pick(cache).tolist() == want_cache


@pytest.mark.kernel
@given(
    layout=shift_layouts(max_window=300),
    hidden=st.sampled_from([1, 7, 64, 130, 257]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**16),
)
@example(layout=LONG_WINDOWS, hidden=300, dtype=torch.bfloat16, seed=3)
def test_hidden_matches_spec(device, layout, hidden, dtype, seed):
    src, dst, cache = make_hidden_case(layout, hidden, dtype, device, seed)
    src_in, cache_in = src.clone().cpu(), cache.clone().cpu()
    run_hidden(layout, src, dst, cache, device)

    zero = torch.zeros(hidden, dtype=dtype)
    nan_row = torch.full((hidden,), float("nan"), dtype=dtype)
    want_dst, want_cache = spec_shift_and_cache(
        list(src_in), [nan_row] * layout.num_tokens, [list(c) for c in cache_in], layout, zero
    )
    if layout.num_tokens:
        assert_bitwise(dst, torch.stack(want_dst))
    if layout.num_reqs:
        assert_bitwise(cache, torch.stack([torch.stack(c) for c in want_cache]))
    assert_bitwise(src, src_in)


# ---------------------------------------------------------------- the invariants


@pytest.mark.kernel
@given(layout=shift_layouts(max_window=200), seed=st.integers(0, 2**16))
@example(layout=LONG_WINDOWS, seed=5)
def test_window_invariants(device, layout, seed):
    """Stated directly, not through the spec: body = src shifted, prefix = cached
    tail, new cache = the dst rows ending at the sample, zeros after."""
    src, dst, cache = make_hidden_case(layout, 24, torch.float32, device, seed)
    old_cache = cache.clone()
    run_hidden(layout, src, dst, cache, device)
    qsl = layout.query_start_loc
    for b in range(layout.num_reqs):
        start, stop, s, c = qsl[b], qsl[b + 1], layout.shift[b], layout.cached_lens[b]
        n_prefix = min(s, stop - start)
        assert torch.equal(dst[start : start + n_prefix], old_cache[b, c - s : c - s + n_prefix])
        if s < stop - start:  # a shift past the window leaves no body
            assert torch.equal(dst[start + s : stop], src[start : stop - s])
        sample = layout.token_indices_to_sample[b]
        n = cache_len = min(max(sample + 1 - max(start, sample + 1 - layout.max_shift), 0), layout.max_shift)
        assert torch.equal(cache[b, :n], dst[sample + 1 - cache_len : sample + 1])
        assert not cache[b, n:].any()
    assert torch.isnan(dst[qsl[-1] if qsl else 0 :]).all(), "padding tokens past the batch were written"


@pytest.mark.kernel
def test_empty_batch_is_a_noop(device):
    layout = ShiftLayout([0], 4, 3, [], [], [], [], [])
    src, dst, cache = make_hidden_case(layout, 16, torch.bfloat16, device, 0)
    run_hidden(layout, src, dst, cache, device)
    assert torch.isnan(dst).all() and cache.shape == (0, 3, 16)
    src1, dst1, cache1 = make_1d_case(layout, None, torch.int64, device, 0)
    run_1d(layout, src1, dst1, cache1, device)
    assert (dst1 == SENTINEL).all()


@pytest.mark.kernel
def test_single_token_windows_shift_fully_from_cache(device):
    # Every window is one token and shifted by one: each output is the last cached
    # entry, and the new cache holds exactly that one token.
    layout = ShiftLayout([0, 1, 2, 3], 3, 4, [4, 2, 1], [1, 1, 1], [0, 1, 2], [9, 9, 9], [10, 10, 10])
    src, dst, cache = make_1d_case(layout, None, torch.int64, device, 0)
    old = cache.clone()
    run_1d(layout, src, dst, cache, device)
    assert dst.tolist() == [old[0, 3].item(), old[1, 1].item(), old[2, 0].item()]
    assert cache[:, 0].tolist() == dst.tolist() and not cache[:, 1:].any()


# ------------------------------------------------------ the interpreter lane only


@pytest.mark.interpreter
@given(
    layout=shift_layouts(max_window=400),
    rows=st.sampled_from([None, 3]),
    seed=st.integers(0, 2**16),
)
@example(layout=LONG_WINDOWS, rows=3, seed=0)
def test_interpreted_1d_kernel_equals_reference(layout, rows, seed):
    src, dst, cache = make_1d_case(layout, rows, torch.int64, "cpu", seed)
    ref_dst, ref_cache = dst.clone(), cache.clone()
    meta = layout.tensors("cpu")
    args = (
        meta["query_start_loc"],
        meta["token_indices_to_sample"],
        meta["shift"],
        meta["cached_lens"],
    )
    run_1d(layout, src, dst, cache, "cpu")
    shift_and_cache_1d_reference(src, ref_dst, ref_cache, *args)
    assert_bitwise(dst, ref_dst)
    assert_bitwise(cache, ref_cache)


@pytest.mark.interpreter
@given(
    layout=shift_layouts(max_window=300),
    hidden=st.sampled_from([5, 256, 300]),
    seed=st.integers(0, 2**16),
)
@example(layout=LONG_WINDOWS, hidden=300, seed=0)
def test_interpreted_hidden_kernel_equals_reference(layout, hidden, seed):
    src, dst, cache = make_hidden_case(layout, hidden, torch.bfloat16, "cpu", seed)
    ref_dst, ref_cache = dst.clone(), cache.clone()
    meta = layout.tensors("cpu")
    args = (
        meta["query_start_loc"],
        meta["token_indices_to_sample"],
        meta["shift"],
        meta["cached_lens"],
    )
    run_hidden(layout, src, dst, cache, "cpu")
    shift_and_cache_hidden_reference(src, ref_dst, ref_cache, *args)
    assert_bitwise(dst, ref_dst)
    assert_bitwise(cache, ref_cache)


# -------------------------------------------------------- the opt-in value checker


def test_value_checker_accepts_generated_layouts():
    @given(layout=shift_layouts())
    def check(layout):
        meta = layout.tensors()
        check_shift_and_cache_values(
            meta["query_start_loc"], meta["token_indices_to_sample"], meta["shift"], meta["cached_lens"],
            layout.max_shift, layout.num_tokens,
        )  # fmt: skip

    check()


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"shift": [2, 0]}, "shift"),  # shift > cached length
        ({"cached_lens": [1, 9]}, "cached_lens"),  # cached length > MAX_SHIFT
        ({"token_indices_to_sample": [3, 4]}, "token_indices_to_sample"),  # outside window
        ({"query_start_loc": [0, 3, 2]}, "query_start_loc"),
    ],
)
def test_value_checker_names_the_argument(change, argument):
    values = {
        "query_start_loc": [0, 3, 5],
        "token_indices_to_sample": [2, 4],
        "shift": [1, 0],
        "cached_lens": [1, 0],
    }
    values.update(change)
    t = {k: torch.tensor(v) for k, v in values.items()}
    with pytest.raises(ValueError, match=argument):
        check_shift_and_cache_values(
            t["query_start_loc"], t["token_indices_to_sample"], t["shift"], t["cached_lens"], 4, 5
        )
