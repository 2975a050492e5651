"""prepare_inputs_padded / prepare_next_token_padded against a plain-Python spec
(specs/prepare_inputs.py), plus their invariants and the padded pipeline against the
unpadded one (prepare_eagle_input).

`kernel` tests run in every lane (CPU reference, interpreter kernel, GPU kernel);
`interpreter` tests compare the kernel with the reference bit for bit.
"""

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specdraft.ops import prepare_eagle_input, prepare_inputs_padded, prepare_next_token_padded
from specdraft.ops.prepare_inputs import prepare_inputs_padded_reference, prepare_next_token_padded_reference
from specdraft.testing import SampledLayout, check_rejection_values, rejection_layouts, sampled_layouts

from specs.prepare_inputs import MANY_REQUESTS, WIDE_ROWS, spec_next_token, spec_prepare_inputs_padded

# ------------------------------------------------------------- prepare_inputs_padded


@pytest.mark.kernel
@given(layout=rejection_layouts(), index_dtype=st.sampled_from([torch.int32, torch.int64]))
@example(layout=MANY_REQUESTS, index_dtype=torch.int64)
def test_prepare_inputs_padded_matches_spec(device, layout, index_dtype):
    meta = layout.tensors(device, index_dtype)
    inputs = {k: v.clone() for k, v in meta.items()}
    out = prepare_inputs_padded(
        meta["cu_num_draft_tokens"], meta["valid_sampled_tokens_count"], meta["query_start_loc"]
    )
    want_sample, want_rejected = spec_prepare_inputs_padded(
        layout.cu_num_draft_tokens, layout.valid_counts, layout.query_start_loc
    )
    assert out.token_indices_to_sample.tolist() == want_sample
    assert out.num_rejected_tokens.tolist() == want_rejected
    assert out.num_rejected_tokens.tolist() == layout.num_rejected_tokens
    qsl = layout.query_start_loc
    for b, i in enumerate(want_sample):
        assert qsl[b] <= i < qsl[b + 1], "sampled index outside its request's window"
    for k, v in inputs.items():
        assert torch.equal(meta[k], v), f"{k} must not be modified"


@pytest.mark.kernel
def test_prepare_inputs_padded_keeps_indices_in_window_for_discarded(device):
    # A request with drafts but 0 valid tokens (discarded): vLLM would point one token
    # before the window; the rejected count is clamped to the drafts instead.
    qsl = torch.tensor([0, 4, 8], device=device)
    out = prepare_inputs_padded(torch.tensor([3, 6], device=device), torch.tensor([0, 2], device=device), qsl)
    assert out.token_indices_to_sample.tolist() == [0, 5]
    assert out.num_rejected_tokens.tolist() == [3, 2]


# --------------------------------------------------------- prepare_next_token_padded


@pytest.mark.kernel
@given(layout=sampled_layouts(), id_dtype=st.sampled_from([torch.int32, torch.int64]))
@example(
    layout=SampledLayout([[3, -2, 5, -1], [7, 9, 9, 9]] * 80, [False, True] * 80, [1, 2] * 80, 9),
    id_dtype=torch.int32,
)
@example(layout=WIDE_ROWS, id_dtype=torch.int64)
def test_prepare_next_token_padded_matches_spec(device, layout, id_dtype):
    t = layout.tensors(device, id_dtype)
    inputs = {k: v.clone() for k, v in t.items()}
    out = prepare_next_token_padded(
        t["sampled_token_ids"], t["discard_request_mask"], t["backup_next_token_ids"], layout.vocab_size
    )
    want_next, want_counts = spec_next_token(layout)
    assert out.next_token_ids.tolist() == want_next
    assert out.valid_sampled_tokens_count.tolist() == want_counts
    assert out.next_token_ids.dtype == id_dtype and out.valid_sampled_tokens_count.dtype == torch.int32
    for k, v in inputs.items():
        assert torch.equal(t[k], v), f"{k} must not be modified"


@pytest.mark.kernel
def test_prepare_next_token_padded_non_contiguous_rows(device):
    full = torch.tensor([[4, 99, 5, 99, -1], [1, 99, 2, 99, 3]], device=device)
    out = prepare_next_token_padded(
        full[:, ::2], torch.tensor([False, False], device=device), torch.tensor([0, 0], device=device), 50
    )
    assert out.next_token_ids.tolist() == [5, 3] and out.valid_sampled_tokens_count.tolist() == [2, 3]


@pytest.mark.kernel
@given(layout=rejection_layouts(max_prefill=20), seed=st.integers(0, 2**16))
def test_padded_pipeline_agrees_with_unpadded(device, layout, seed):
    """Sampler output -> next tokens -> padded metadata: the rejected counts equal the
    layout's, and sampling at each index equals sampling the last kept row of the
    unpadded (packed) path."""
    gen = torch.Generator().manual_seed(seed)
    k = max(layout.num_draft_tokens, default=0)
    rows = torch.full((layout.num_reqs, k + 1), -1, dtype=torch.int32)
    for b, v in enumerate(layout.valid_counts):
        rows[b, :v] = torch.randint(0, 100, (v,), generator=gen, dtype=torch.int32)
    meta = layout.tensors(device)
    discard = torch.zeros(layout.num_reqs, dtype=torch.bool, device=device)
    nxt = prepare_next_token_padded(rows.to(device), discard, torch.zeros_like(discard, dtype=torch.int32), 100)
    assert nxt.valid_sampled_tokens_count.tolist() == layout.valid_counts
    padded = prepare_inputs_padded(meta["cu_num_draft_tokens"], nxt.valid_sampled_tokens_count, meta["query_start_loc"])
    assert padded.num_rejected_tokens.tolist() == layout.num_rejected_tokens
    packed = prepare_eagle_input(meta["query_start_loc"], padded.num_rejected_tokens, layout.num_kept_tokens)
    last_kept = [packed.token_indices[c - 1].item() for c in packed.cu_num_tokens[1:].tolist()]
    assert padded.token_indices_to_sample.tolist() == last_kept


# ------------------------------------------------------------------- bad arguments


def _i(values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype)


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda: prepare_inputs_padded(_i([1]), _i([1]), _i([[0, 2]])), "query_start_loc"),
        (lambda: prepare_inputs_padded(_i([1, 2]), _i([1]), _i([0, 2])), "cu_num_draft_tokens"),
        (lambda: prepare_inputs_padded(_i([1]), _i([1]).bool(), _i([0, 2])), "valid_sampled_tokens_count"),
        (lambda: prepare_next_token_padded(_i([1, 2]), _i([0]).bool(), _i([0]), 9), "sampled_token_ids"),
        (lambda: prepare_next_token_padded(_i([[1, 2]]), _i([0]), _i([0]), 9), "discard_request_mask"),
        (lambda: prepare_next_token_padded(_i([[1, 2]]), _i([0]).bool(), _i([0, 1]), 9), "backup_next_token_ids"),
        (lambda: prepare_next_token_padded(_i([[1, 2]]), _i([0]).bool(), _i([0]), 0), "vocab_size"),
        (lambda: prepare_next_token_padded(_i([[1, 2]]).float(), _i([0]).bool(), _i([0]), 9), "sampled_token_ids"),
        (
            lambda: prepare_next_token_padded(torch.zeros(1, 0, dtype=torch.int32), _i([0]).bool(), _i([0]), 9),
            "sampled_token_ids",
        ),  # fmt: skip
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
@given(layout=rejection_layouts(max_requests=40))
@example(layout=MANY_REQUESTS)
def test_interpreted_padded_kernel_equals_reference(layout):
    meta = layout.tensors("cpu")
    args = (meta["cu_num_draft_tokens"], meta["valid_sampled_tokens_count"], meta["query_start_loc"])
    for got, want in zip(prepare_inputs_padded(*args), prepare_inputs_padded_reference(*args), strict=True):
        assert_bitwise(got, want)


@pytest.mark.interpreter
@given(layout=sampled_layouts(max_requests=200))
@example(layout=WIDE_ROWS)
def test_interpreted_next_token_kernel_equals_reference(layout):
    t = layout.tensors("cpu", torch.int64)
    args = (t["sampled_token_ids"], t["discard_request_mask"], t["backup_next_token_ids"], layout.vocab_size)
    for got, want in zip(prepare_next_token_padded(*args), prepare_next_token_padded_reference(*args), strict=True):
        assert_bitwise(got, want)


# -------------------------------------------------------- the opt-in value checker


def test_value_checker_accepts_generated_layouts():
    @given(layout=rejection_layouts())
    def check(layout):
        m = layout.tensors()
        check_rejection_values(
            m["query_start_loc"], m["num_rejected_tokens"], m["cu_num_draft_tokens"], m["valid_sampled_tokens_count"]
        )

    check()


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"query_start_loc": [0, 3, 2]}, "query_start_loc"),
        ({"num_rejected_tokens": [4, 0]}, "num_rejected_tokens"),
        ({"cu_num_draft_tokens": [3, 3]}, "cu_num_draft_tokens"),  # 3 drafts in a 3-token window
        ({"valid_sampled_tokens_count": [4, 1]}, "valid_sampled_tokens_count"),  # > drafts + 1
    ],
)
def test_value_checker_names_the_argument(change, argument):
    values = {
        "query_start_loc": [0, 3, 5],
        "num_rejected_tokens": [1, 0],
        "cu_num_draft_tokens": [2, 2],
        "valid_sampled_tokens_count": [2, 1],
    }
    values.update(change)
    t = {k: torch.tensor(v) for k, v in values.items()}
    with pytest.raises(ValueError, match=argument):
        check_rejection_values(
            t["query_start_loc"], t["num_rejected_tokens"], t["cu_num_draft_tokens"], t["valid_sampled_tokens_count"]
        )
