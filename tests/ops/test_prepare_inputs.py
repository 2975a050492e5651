"""prepare_eagle_input / prepare_inputs_padded / prepare_next_token_padded against a
plain-Python spec, plus their invariants.

`kernel` tests run in every lane (CPU reference, interpreter kernel, GPU kernel);
`interpreter` tests compare the kernel with the reference bit for bit.
"""

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specdraft.ops import prepare_eagle_input, prepare_inputs_padded, prepare_next_token_padded
from specdraft.ops.prepare_inputs import (
    prepare_eagle_input_reference,
    prepare_inputs_padded_reference,
    prepare_next_token_padded_reference,
)
from specdraft.testing import (
    RejectionLayout,
    SampledLayout,
    check_rejection_values,
    rejection_layouts,
    sampled_layouts,
)

# ----------------------------------------------------------------- the spec (loops)


def spec_prepare_eagle_input(qsl, rejected, num_tokens):
    cu_new, indices = [0], []
    for b in range(len(rejected)):
        kept = qsl[b + 1] - qsl[b] - rejected[b]
        indices += list(range(qsl[b], qsl[b] + kept))
        cu_new.append(cu_new[-1] + kept)
    return cu_new, (indices + [0] * num_tokens)[:num_tokens]


def spec_prepare_inputs_padded(cu_drafts, valid, qsl):
    samples, rejected = [], []
    for b in range(len(cu_drafts)):
        drafts = cu_drafts[b] - (cu_drafts[b - 1] if b else 0)
        rej = drafts + 1 - valid[b] if drafts > 0 else 0
        samples.append(qsl[b + 1] - 1 - rej)
        rejected.append(rej)
    return samples, rejected


def spec_next_token(layout: SampledLayout):
    next_ids, counts = [], []
    for row, discard, backup in zip(layout.sampled_token_ids, layout.discard, layout.backup, strict=True):
        valid = [t for t in row if 0 <= t < layout.vocab_size] if not discard else []
        next_ids.append(valid[-1] if valid else backup)
        counts.append(len(valid))
    return next_ids, counts


# Past one scan block (256 requests) and one token block (32 rows).
MANY_REQUESTS = RejectionLayout(
    query_lens=[(b % 5) + 1 if b % 7 else 40 for b in range(300)],
    num_draft_tokens=[(b % 5) if b % 7 else 0 for b in range(300)],
    valid_counts=[((b * 3) % ((b % 5) + 1)) + 1 if b % 7 else 1 for b in range(300)],
)


# K+1 = 21 > one 16-column chunk of the kernel: the last valid id in either chunk.
WIDE_ROWS = SampledLayout(
    [[5] * 20 + [-1], [5] * 3 + [-1] * 18, [-1] * 16 + [7, 99, 8, -1, -1], [-1] * 21],
    [False] * 4,
    [1, 2, 3, 4],
    50,
)

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
        (lambda: prepare_eagle_input(_i([0, 2]).float(), _i([0]), 2), "cu_target_query_lens"),
        (lambda: prepare_eagle_input(_i([0, 2]), _i([0, 0]), 2), "num_rejected_tokens"),
        (lambda: prepare_eagle_input(_i([0, 2]), _i([0]), -1), "num_tokens"),
        (lambda: prepare_eagle_input(_i([0, 2]), _i([0]), 2.0), "num_tokens"),
        (lambda: prepare_eagle_input(_i([]), _i([]), 2), "cu_target_query_lens"),
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
@given(layout=rejection_layouts(max_requests=40), extra=st.integers(0, 70))
@example(layout=MANY_REQUESTS, extra=130)
def test_interpreted_prepare_kernels_equal_reference(layout, extra):
    meta = layout.tensors("cpu")
    args = (meta["query_start_loc"], meta["num_rejected_tokens"], layout.num_kept_tokens + extra)
    for got, want in zip(prepare_eagle_input(*args), prepare_eagle_input_reference(*args), strict=True):
        assert_bitwise(got, want)
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
        ({"valid_sampled_tokens_count": [0, 1]}, "valid_sampled_tokens_count"),
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
