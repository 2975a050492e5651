"""Saved target outputs: what a draft head is evaluated against offline, one packed
batch per safetensors file (a "shard").

A shard holds, under these names:

- `input_ids` [T] int32 / int64: S sequences laid end to end;
- `hidden_states` [T, H_target]: what the head reads (EAGLE-3: the target's aux
  layers concatenated, [T, 3 * H]; EAGLE-1 / MTP: the final hidden state);
- `target_logits` [T, V] fp32 / bf16 / fp16: the target's output at every row;
- `cu_seqlens` [S + 1] int32 / int64, optional (one sequence when absent);
- `positions` [T] or M-RoPE [3, T] int, optional (each sequence from 0 when absent);
- `loss_mask` [T] bool / int, optional (every row scored when absent).

The file's string metadata records how it was made (`format`, `aux_layers`,
`target`; see `save_batch`). A data folder is every `*.safetensors` in it, in name
order. Errors name the file and the tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open

from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, check_tensor_arg
from specdraft.models.safetensors_io import write_safetensors

FORMAT = "specdraft.target_outputs.v1"
REQUIRED = ("input_ids", "hidden_states", "target_logits")
OPTIONAL = ("cu_seqlens", "positions", "loss_mask")


class TargetBatch(NamedTuple):
    """One packed batch of target outputs (module docstring); positions, cu_seqlens
    and loss_mask are always filled in (their defaults when the shard had none)."""

    token_ids: torch.Tensor
    hidden_states: torch.Tensor
    target_logits: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    loss_mask: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]

    def to(self, device) -> TargetBatch:
        return TargetBatch(*(None if t is None else t.to(device) for t in self))

    def unroll_args(self) -> tuple:
        """(token_ids, hidden_states, positions, cu_seqlens): unroll's inputs."""
        return self.token_ids, self.hidden_states, self.positions, self.cu_seqlens


def packed_positions(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[T] int64: each row's position within its sequence (0, 1, ... per sequence)."""
    rows = torch.arange(num_tokens, device=cu_seqlens.device)
    starts = cu_seqlens.long()[:-1]
    seq = (starts[None, :] <= rows[:, None]).sum(1) - 1
    return rows - starts[seq.clamp(min=0)]


def check_target_batch(batch: TargetBatch, where: str = "batch") -> None:
    """Shapes, dtypes and the cumulative-count convention (cu_seqlens from 0 to T,
    non-decreasing); ValueError naming `where` and the tensor."""
    num_tokens = batch.token_ids.shape[0] if batch.token_ids.dim() == 1 else -1

    def named(key):
        return f"{where}: {key}"

    check_tensor_arg(named("input_ids"), batch.token_ids, INDEX_DTYPES, rank=1)
    check_tensor_arg(named("hidden_states"), batch.hidden_states, FLOAT_DTYPES, shape=(num_tokens, None))
    check_tensor_arg(named("target_logits"), batch.target_logits, FLOAT_DTYPES, shape=(num_tokens, None))
    check_tensor_arg(named("positions"), batch.positions, INDEX_DTYPES, shape=[(num_tokens,), (3, num_tokens)])
    check_tensor_arg(named("cu_seqlens"), batch.cu_seqlens, INDEX_DTYPES, rank=1)
    check_tensor_arg(named("loss_mask"), batch.loss_mask, (torch.bool, *INDEX_DTYPES), shape=(num_tokens,),
                     optional=True)  # fmt: skip
    cu = batch.cu_seqlens.tolist()
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != num_tokens or any(b < a for a, b in zip(cu, cu[1:], strict=False)):
        raise ValueError(
            f"{named('cu_seqlens')} must run non-decreasing from 0 to the {num_tokens} tokens (S + 1 entries), "
            f"got {cu[:8]}{' ...' if len(cu) > 8 else ''}"
        )


def save_batch(path: str | Path, batch: TargetBatch, *, aux_layers=(), target: str = "") -> None:
    """Write one shard (module docstring). aux_layers and target are recorded in the
    file's metadata, for the reader to check against the head it evaluates."""
    check_target_batch(batch, str(path))
    tensors = {
        "input_ids": batch.token_ids,
        "hidden_states": batch.hidden_states,
        "target_logits": batch.target_logits,
        "cu_seqlens": batch.cu_seqlens,
        "positions": batch.positions,
    }
    if batch.loss_mask is not None:
        tensors["loss_mask"] = batch.loss_mask
    metadata = {"format": FORMAT, "aux_layers": json.dumps(list(aux_layers)), "target": str(target)}
    write_safetensors(path, tensors, metadata)


def shard_paths(data: str | Path) -> list[Path]:
    """The shards of a data folder (every *.safetensors, name order), or [data] for
    one file."""
    data = Path(data)
    if data.is_file():
        return [data]
    if not data.is_dir():
        raise ValueError(f"data: {data} is neither a .safetensors file nor a folder")
    paths = sorted(data.glob("*.safetensors"))
    if not paths:
        raise ValueError(f"data: {data} holds no *.safetensors shards")
    return paths


def shard_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata of a shard (empty when it has none)."""
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def load_batch(path: str | Path, device: torch.device | str = "cpu") -> TargetBatch:
    """Read one shard onto `device`, its optional tensors filled in, checked."""
    with safe_open(str(path), framework="pt", device="cpu") as f:
        keys = set(f.keys())
        missing = [k for k in REQUIRED if k not in keys]
        if missing:
            raise ValueError(
                f"{path}: tensor(s) {missing} missing; a shard holds {list(REQUIRED)} (+ {list(OPTIONAL)})"
            )
        unknown = sorted(keys - set(REQUIRED) - set(OPTIONAL))
        if unknown:
            raise ValueError(f"{path}: unknown tensor(s) {unknown}; a shard holds {list(REQUIRED + OPTIONAL)}")
        tensors = {k: f.get_tensor(k) for k in keys}
    token_ids = tensors["input_ids"]
    num_tokens = token_ids.shape[0] if token_ids.dim() == 1 else 0
    cu_seqlens = tensors.get("cu_seqlens")
    if cu_seqlens is None:
        cu_seqlens = torch.tensor([0, num_tokens], dtype=torch.int64)
    positions = tensors.get("positions")
    if positions is None:
        positions = packed_positions(cu_seqlens, num_tokens) if cu_seqlens.dim() == 1 else cu_seqlens
    batch = TargetBatch(
        token_ids, tensors["hidden_states"], tensors["target_logits"], positions, cu_seqlens, tensors.get("loss_mask")
    )
    check_target_batch(batch, str(path))
    return batch.to(device)


def split_batch(batch: TargetBatch, max_tokens: int) -> list[TargetBatch]:
    """Consecutive sequences grouped into batches of at most max_tokens rows (a
    longer sequence makes a batch of its own). The unroll's attention over a packed
    batch costs O(T^2) on the dense path, so smaller groups of whole sequences are
    cheaper and give the same sums (the metrics never cross a sequence boundary)."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
    cu = batch.cu_seqlens.tolist()
    groups, first = [], 0
    for i in range(1, len(cu)):
        if cu[i] - cu[first] > max_tokens and i - 1 > first:
            groups.append((first, i - 1))
            first = i - 1
    groups.append((first, len(cu) - 1))
    if len(groups) == 1:
        return [batch]
    out = []
    for a, b in groups:
        lo, hi = cu[a], cu[b]
        out.append(
            TargetBatch(
                token_ids=batch.token_ids[lo:hi],
                hidden_states=batch.hidden_states[lo:hi],
                target_logits=batch.target_logits[lo:hi],
                positions=batch.positions[..., lo:hi],
                cu_seqlens=batch.cu_seqlens[a : b + 1] - lo,
                loss_mask=None if batch.loss_mask is None else batch.loss_mask[lo:hi],
            )
        )
    return out
