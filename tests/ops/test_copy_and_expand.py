"""copy_and_expand_inputs against a plain-Python spec, plus its invariants.

Tests marked `kernel` run in every lane (CPU reference, TRITON_INTERPRET=1 kernel,
CUDA kernel); `interpreter` ones compare the kernel with the reference bit for bit.
"""

from dataclasses import replace

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from specdraft.ops import copy_and_expand_inputs
from specdraft.ops.copy_and_expand import copy_and_expand_inputs_reference
from specdraft.testing import ExpandLayout, expand_layouts

PAD_ID, PAR_ID = 0, 99_999_999


# ----------------------------------------------------------------- the spec (loops)


def spec_expand(layout: ExpandLayout, ids: list[int], next_ids: list[int]) -> dict[str, list]:
    """One output slot at a time, windows appended in request order, then the tail."""
    p, s = layout.num_padding_slots_per_request, int(layout.shift_input_ids)
    positions = layout.positions()
    out = {k: [] for k in ("input_ids", "positions", "is_rejected_token_mask", "is_masked_token_mask")}
    new_token_indices, mapping = [], [None] * layout.num_tokens

    def emit(token, pos, rejected, masked):
        out["input_ids"].append(token)
        out["positions"].append(pos)
        out["is_rejected_token_mask"].append(rejected)
        out["is_masked_token_mask"].append(masked)

    for r in range(layout.num_reqs):
        start, stop = layout.query_start_loc[r], layout.query_start_loc[r + 1]
        out_start = len(out["input_ids"])
        # Without the shift the token at query_end is valid; with it, the window's
        # first token drops out and the valid run is one shorter.
        num_valid = (stop - 1 - layout.num_rejected[r]) - start + 1 - s
        for j in range(num_valid):
            emit(ids[start + s + j], positions[start] + j, False, False)
        emit(next_ids[r], positions[start] + num_valid, False, False)
        for k in range(1, p):
            emit(PAR_ID, positions[start] + num_valid + k, False, True)
        for _ in range(layout.num_rejected[r]):
            emit(PAD_ID, 0, True, False)
        new_token_indices += [out_start + num_valid + k for k in range(p)]
        for j in range(stop - start):
            mapping[start + j] = out_start + j
    tail_out = len(out["input_ids"])
    for t in range(layout.query_start_loc[-1], layout.num_tokens):
        emit(PAD_ID, 0, True, False)
        mapping[t] = tail_out + t - layout.query_start_loc[-1]
    out["new_token_indices"] = new_token_indices
    out["hidden_state_mapping"] = mapping
    return out


# -------------------------------------------------------------------------- helpers


def run(layout: ExpandLayout, device, index_dtype=torch.int32, seed=0, rejected=True, max_query_len="exact"):
    t = layout.tensors(device, index_dtype, seed)
    return t, copy_and_expand_inputs(
        t["target_token_ids"], t["target_positions"], t["next_token_ids"], t["query_start_loc"],
        t["num_rejected_tokens"] if rejected else None,
        num_padding_slots_per_request=layout.num_padding_slots_per_request,
        parallel_drafting_token_id=PAR_ID, shift_input_ids=layout.shift_input_ids, padding_token_id=PAD_ID,
        max_query_len=layout.max_query_len if max_query_len == "exact" else max_query_len,
    )  # fmt: skip


def out_windows(layout: ExpandLayout) -> list[tuple[int, int]]:
    starts, o = [], 0
    for n in layout.window_lens:
        starts.append((o, o + n + layout.growth))
        o += n + layout.growth
    return starts


# Two prefill chunks of several token blocks around decode requests, padded input.
LONG = ExpandLayout(
    query_start_loc=[0, 4, 304, 308, 509],
    num_tokens=512,
    num_rejected=[2, 0, 3, 0],
    first_positions=[90, 0, 96, 299],
    num_padding_slots_per_request=3,
    shift_input_ids=True,
    block_size=16,
    max_model_len=500,
    block_table=[list(range(r * 32, r * 32 + 32)) for r in range(4)],
)


# --------------------------------------------------------------------- spec tests


@pytest.mark.kernel
@given(
    layout=expand_layouts(),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 2**16),
)
@example(layout=LONG, index_dtype=torch.int32, seed=0)
@example(layout=replace(LONG, shift_input_ids=False), index_dtype=torch.int64, seed=1)
def test_matches_spec(device, layout, index_dtype, seed):
    t, got = run(layout, device, index_dtype, seed)
    want = spec_expand(layout, t["target_token_ids"].tolist(), t["next_token_ids"].tolist())
    for name, value in got._asdict().items():
        assert value.tolist() == want[name], name
    assert got.input_ids.dtype == torch.int32 and got.positions.dtype == torch.int64
    assert got.new_token_indices.dtype == index_dtype and got.hidden_state_mapping.dtype == index_dtype


@pytest.mark.kernel
@given(layout=expand_layouts(max_prefill=200), hint=st.sampled_from([0, 1, 5, None]))
def test_max_query_len_is_only_a_grid_hint(device, layout, hint):
    """Any hint, even far below the longest window, gives the same result."""
    _, exact = run(layout, device)
    _, hinted = run(layout, device, max_query_len=hint)
    for a, b in zip(exact, hinted, strict=True):
        assert torch.equal(a, b)


@pytest.mark.kernel
@given(layout=expand_layouts(max_prefill=100))
def test_no_rejected_tensor_means_none_rejected(device, layout):
    plain = replace(layout, num_rejected=[0] * layout.num_reqs)
    _, without = run(layout, device, rejected=False)
    _, zeros = run(plain, device)
    for a, b in zip(without, zeros, strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------- the invariants


@pytest.mark.kernel
@given(layout=expand_layouts(), seed=st.integers(0, 2**16))
@example(layout=LONG, seed=0)
def test_invariants(device, layout, seed):
    """Stated directly, not through the spec."""
    t, got = run(layout, device, seed=seed)
    p, s = layout.num_padding_slots_per_request, int(layout.shift_input_ids)
    windows = out_windows(layout)
    # Expanded windows and the tail add up to the output size.
    tail = layout.num_tokens - layout.query_start_loc[-1]
    assert sum(b - a for a, b in windows) + tail == got.input_ids.shape[0] == layout.num_out
    rejected, masked = got.is_rejected_token_mask.tolist(), got.is_masked_token_mask.tolist()
    new = got.new_token_indices.view(layout.num_reqs, p).tolist()
    for r, (a, b) in enumerate(windows):
        # Sampled slots: inside the request's window, consecutive, bonus first.
        assert all(a <= i < b for i in new[r]) and new[r] == list(range(new[r][0], new[r][0] + p))
        assert got.input_ids[new[r][0]].item() == t["next_token_ids"][r].item()
        # Masks agree with the counts: P - 1 masked, num_rejected rejected, disjoint.
        assert sum(masked[a:b]) == p - 1 and sum(rejected[a:b]) == layout.num_rejected[r]
        assert not any(m and x for m, x in zip(masked[a:b], rejected[a:b], strict=True))
        assert all(got.input_ids[i].item() == PAR_ID for i in range(a, b) if masked[i])
        assert all(
            got.positions[i].item() == 0 and got.input_ids[i].item() == PAD_ID for i in range(a, b) if rejected[i]
        )
        # Rejected slots close the window; positions before them run on from the first.
        n_live = b - a - layout.num_rejected[r]
        assert got.positions[a : a + n_live].tolist() == [layout.first_positions[r] + j for j in range(n_live)]
        # Valid slots hold the input tokens, shifted by one when asked.
        start = layout.query_start_loc[r]
        num_valid = new[r][0] - a
        assert (
            got.input_ids[a : a + num_valid].tolist()
            == t["target_token_ids"][start + s : start + s + num_valid].tolist()
        )
    assert all(rejected[windows[-1][1] if windows else 0 :]) and not any(masked[windows[-1][1] if windows else 0 :])
    # The hidden-state mapping is injective and keeps each request in its window.
    mapping = got.hidden_state_mapping.tolist()
    assert len(set(mapping)) == len(mapping) and all(0 <= m < layout.num_out for m in mapping)
    for r, (a, b) in enumerate(windows):
        qa, qb = layout.query_start_loc[r], layout.query_start_loc[r + 1]
        assert all(a <= m < b for m in mapping[qa:qb])


@pytest.mark.kernel
@given(layout=expand_layouts(max_prefill=60, shift_input_ids=True), hidden=st.sampled_from([1, 8]))
def test_hidden_state_mapping_pairs_tokens_with_hidden_states(device, layout, hidden):
    """With the shift, slot j of a window holds input token j + 1 and the hidden
    state of input token j (the state that predicted it)."""
    t, got = run(layout, device)
    states = torch.arange(layout.num_tokens, dtype=torch.float32, device=device)[:, None].expand(-1, hidden)
    out = torch.full((layout.num_out, hidden), -1.0, device=device)
    out.index_copy_(0, got.hidden_state_mapping.long(), states)
    s = int(layout.shift_input_ids)
    for r, (a, _) in enumerate(out_windows(layout)):
        start = layout.query_start_loc[r]
        num_valid = got.new_token_indices[r * layout.num_padding_slots_per_request].item() - a
        for j in range(num_valid + 1):  # the valid slots and the bonus
            assert out[a + j, 0].item() == start + j
            if j < num_valid:
                assert got.input_ids[a + j].item() == t["target_token_ids"][start + j + s].item()


@pytest.mark.kernel
@given(layout=expand_layouts(max_prefill=80), seed=st.integers(0, 2**16))
def test_inputs_and_their_surroundings_are_not_written(device, layout, seed):
    """Inputs are views into sentinel-filled buffers: neither they nor the memory
    around them change."""
    t = layout.tensors(device, torch.int32, seed)

    def embed(x):
        big = torch.full((x.numel() + 16,), -4242, dtype=x.dtype, device=device)
        big[8 : 8 + x.numel()] = x
        return big, big[8 : 8 + x.numel()]

    names = ("target_token_ids", "target_positions", "next_token_ids", "query_start_loc", "num_rejected_tokens")
    bigs, views = zip(*(embed(t[n]) for n in names), strict=True)
    before = [b.clone() for b in bigs]
    copy_and_expand_inputs(
        *views[:4], views[4], num_padding_slots_per_request=layout.num_padding_slots_per_request,
        parallel_drafting_token_id=PAR_ID, shift_input_ids=layout.shift_input_ids,
    )  # fmt: skip
    for name, b, b0 in zip(names, bigs, before, strict=True):
        assert torch.equal(b, b0), name


@pytest.mark.kernel
def test_empty_batch_is_all_tail(device):
    layout = ExpandLayout([0], 3, [], [], 4, True, 16, 64, [])
    _, got = run(layout, device)
    assert got.input_ids.tolist() == [PAD_ID] * 3 and got.is_rejected_token_mask.all()
    assert got.new_token_indices.shape == (0,) and got.hidden_state_mapping.tolist() == [0, 1, 2]


# ------------------------------------------------------ the interpreter lane only


@pytest.mark.interpreter
@given(layout=expand_layouts(), index_dtype=st.sampled_from([torch.int32, torch.int64]), seed=st.integers(0, 99))
@example(layout=LONG, index_dtype=torch.int64, seed=0)
def test_interpreted_kernel_equals_reference(layout, index_dtype, seed):
    t, got = run(layout, "cpu", index_dtype, seed)
    want = copy_and_expand_inputs_reference(
        t["target_token_ids"], t["target_positions"], t["next_token_ids"], t["query_start_loc"],
        t["num_rejected_tokens"], layout.num_padding_slots_per_request, PAD_ID, PAR_ID, layout.shift_input_ids,
    )  # fmt: skip
    for name, a, b in zip(got._fields, got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name


# ------------------------------------------------------------------- bad input


def _args():
    t = LONG.tensors()
    args = {k: t[k] for k in ("target_token_ids", "target_positions", "next_token_ids", "query_start_loc")}
    args["num_rejected_tokens"] = t["num_rejected_tokens"]
    kwargs = {"num_padding_slots_per_request": 3, "parallel_drafting_token_id": 5, "shift_input_ids": True}
    return args, kwargs


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"target_token_ids": torch.zeros(512)}, "target_token_ids"),  # float
        ({"target_token_ids": torch.zeros(4, 128, dtype=torch.int32)}, "target_token_ids"),
        ({"target_token_ids": torch.zeros(1024, dtype=torch.int32)[::2]}, "target_token_ids"),  # strided
        ({"target_positions": torch.zeros(511, dtype=torch.int64)}, "target_positions"),
        ({"target_positions": torch.zeros(3, 512, dtype=torch.int64)}, "target_positions"),
        ({"next_token_ids": torch.zeros(5, dtype=torch.int32)}, "next_token_ids"),
        ({"query_start_loc": torch.zeros(0, dtype=torch.int32)}, "query_start_loc"),
        ({"query_start_loc": torch.zeros(5, dtype=torch.float32)}, "query_start_loc"),
        ({"num_rejected_tokens": torch.zeros(3, dtype=torch.int32)}, "num_rejected_tokens"),
        ({"num_rejected_tokens": torch.zeros(4, dtype=torch.bool)}, "num_rejected_tokens"),
        ({"num_padding_slots_per_request": 0}, "num_padding_slots_per_request"),
        ({"num_padding_slots_per_request": 2.0}, "num_padding_slots_per_request"),
        ({"parallel_drafting_token_id": 2**40}, "parallel_drafting_token_id"),
        ({"padding_token_id": None}, "padding_token_id"),
        ({"shift_input_ids": 1}, "shift_input_ids"),
        ({"max_query_len": -1}, "max_query_len"),
        ({"next_token_ids": "meta"}, "next_token_ids"),  # another device
    ],
)
def test_bad_input_names_the_argument(change, argument):
    args, kwargs = _args()
    for key, value in change.items():
        if isinstance(value, str) and value == "meta":
            value = args[key].to("meta")
        (args if key in args else kwargs)[key] = value
    with pytest.raises(ValueError, match=argument):
        copy_and_expand_inputs(*args.values(), **kwargs)
