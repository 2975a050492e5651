"""Shards of saved target outputs (specdraft.training.shards): what is written is read
back, missing optional tensors get their documented defaults, bad files are refused
naming the file and the tensor, and split_batch groups whole sequences as a plain
greedy loop over the lengths does."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save_file

from specdraft.training import TargetBatch, load_batch, save_batch, shard_metadata, shard_paths, split_batch


def make_batch(lengths, hidden=6, vocab=11, seed=0, mask=True):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return TargetBatch(
        token_ids=torch.randint(0, vocab, (total,), generator=gen),
        hidden_states=torch.randn(total, hidden, generator=gen),
        target_logits=torch.randn(total, vocab, generator=gen).bfloat16(),
        positions=torch.randint(0, 50, (3, total), generator=gen),
        cu_seqlens=cu.int(),
        loss_mask=(torch.rand(total, generator=gen) > 0.3) if mask else None,
    )


def test_round_trip_keeps_every_tensor_and_the_metadata(tmp_path):
    batch = make_batch([3, 5, 1])
    save_batch(tmp_path / "a.safetensors", batch, aux_layers=(2, 2, 1), target="t")
    got = load_batch(tmp_path / "a.safetensors")
    for name, want in batch._asdict().items():
        assert torch.equal(getattr(got, name), want), name
        assert getattr(got, name).dtype == want.dtype, name
    meta = shard_metadata(tmp_path / "a.safetensors")
    assert meta["aux_layers"] == "[2, 2, 1]" and meta["target"] == "t"


def test_optional_tensors_take_their_defaults(tmp_path):
    batch = make_batch([4, 2, 3])
    path = tmp_path / "b.safetensors"
    save_file({"input_ids": batch.token_ids, "hidden_states": batch.hidden_states,
               "target_logits": batch.target_logits, "cu_seqlens": batch.cu_seqlens}, str(path))  # fmt: skip
    got = load_batch(path)
    assert got.positions.tolist() == [0, 1, 2, 3, 0, 1, 0, 1, 2]  # each sequence from 0
    assert got.loss_mask is None
    save_file({"input_ids": batch.token_ids, "hidden_states": batch.hidden_states,
               "target_logits": batch.target_logits}, str(path))  # fmt: skip
    got = load_batch(path)
    assert got.cu_seqlens.tolist() == [0, 9] and got.positions.tolist() == list(range(9))


def write(path, **tensors):
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.pop("target_logits"), r"\['target_logits'\] missing"),
        (lambda t: t.update(extra=torch.zeros(1)), r"unknown tensor\(s\) \['extra'\]"),
        (lambda t: t.update(cu_seqlens=torch.tensor([0, 4, 8])), "cu_seqlens must run non-decreasing from 0 to the 9"),
        (lambda t: t.update(cu_seqlens=torch.tensor([0, 6, 3, 9])), "cu_seqlens must run non-decreasing"),
        (lambda t: t.update(hidden_states=torch.zeros(8, 6)), "hidden_states must have shape"),
        (lambda t: t.update(target_logits=torch.zeros(9, 11, dtype=torch.int32)), "target_logits must have dtype"),
        (lambda t: t.update(input_ids=torch.zeros(9)), "input_ids must have dtype"),
        (lambda t: t.update(loss_mask=torch.zeros(4, dtype=torch.bool)), "loss_mask must have shape"),
    ],
)
def test_bad_shards_are_refused_naming_file_and_tensor(tmp_path, change, message):
    batch = make_batch([4, 2, 3])
    tensors = {"input_ids": batch.token_ids, "hidden_states": batch.hidden_states,
               "target_logits": batch.target_logits, "cu_seqlens": batch.cu_seqlens}  # fmt: skip
    change(tensors)
    path = write(tmp_path / "bad.safetensors", **tensors)
    with pytest.raises(ValueError, match=message) as error:
        load_batch(path)
    assert "bad.safetensors" in str(error.value)


def test_shard_paths(tmp_path):
    for name in ("b.safetensors", "a.safetensors", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in shard_paths(tmp_path)] == ["a.safetensors", "b.safetensors"]
    assert shard_paths(tmp_path / "b.safetensors") == [tmp_path / "b.safetensors"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no"):
        shard_paths(tmp_path / "empty")
    with pytest.raises(ValueError, match="neither"):
        shard_paths(tmp_path / "missing")


def expected_groups(lengths, max_tokens):
    """A plain greedy loop: add sequences to the open group while it stays within
    max_tokens; a sequence longer than that makes a group of its own."""
    groups, current = [], []
    for n in lengths:
        if current and sum(current) + n > max_tokens:
            groups.append(current)
            current = []
        current.append(n)
    groups.append(current)
    return groups


@given(st.lists(st.integers(0, 9), min_size=1, max_size=8), st.integers(1, 12), st.booleans())
def test_split_batch_groups_whole_sequences(lengths, max_tokens, mask):
    batch = make_batch(lengths, mask=mask)
    parts = split_batch(batch, max_tokens)
    groups = expected_groups(lengths, max_tokens)
    assert [torch.diff(p.cu_seqlens).tolist() for p in parts] == groups
    for name in ("token_ids", "hidden_states", "target_logits", "loss_mask"):
        if getattr(batch, name) is not None:
            assert torch.equal(torch.cat([getattr(p, name) for p in parts]), getattr(batch, name)), name
    assert torch.equal(torch.cat([p.positions for p in parts], dim=-1), batch.positions)
    assert all(int(p.cu_seqlens[0]) == 0 and int(p.cu_seqlens[-1]) == p.num_tokens for p in parts)


def test_split_batch_refuses_a_bad_bound():
    with pytest.raises(ValueError, match="max_tokens must be a positive int"):
        split_batch(make_batch([2]), 0)
