"""Data-parallel evaluation under `torchrun`: which shards a rank evaluates, the
process group, and errors that stop every rank instead of hanging the others.

    torchrun --nproc-per-node 2 -m specdraft.eval HEAD DATA --device cuda

Each rank evaluates its share of the shards (`share_shards`: balanced by token
count) and the sums are all-reduced once (`metrics.reduce`). The sums are exact
(metrics' module docstring), so N ranks report the same numbers as one process.

A collective waits for every rank: one that raises before it would leave the others
waiting until the group's timeout. So each stage of the evaluation runs under
`all_ranks_or_none`: a rank's error is caught, every rank learns of it in one
all_gather, and every rank raises.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks torchrun started (one process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()


def ranks_from_env() -> Ranks | None:
    """The ranks torchrun describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK),
    or None when this process was not started by torchrun."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    try:
        rank, world_size, local_rank = (int(os.environ.get(name, "0")) for name in names)
    except ValueError:
        raise ValueError(f"torchrun environment: {', '.join(names)} must be integers") from None
    if not 0 <= rank < world_size:
        raise ValueError(f"torchrun environment: RANK={rank} is not in [0, WORLD_SIZE={world_size})")
    return Ranks(rank, world_size, local_rank)


def rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """The device this rank runs on: "cuda" (no index) means the local rank's GPU;
    an explicit index is kept (then each rank should be given its own)."""
    if device.type == "cuda" and device.index is None:
        if ranks.local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"--device cuda: local rank {ranks.local_rank} needs GPU {ranks.local_rank}, "
                f"this machine has {torch.cuda.device_count()}"
            )
        return torch.device("cuda", ranks.local_rank)
    return device


def init_process_group(device: torch.device, ranks: Ranks) -> None:
    """NCCL on CUDA, gloo on CPU, rendezvous through torchrun's environment. The
    current CUDA device is set first: NCCL and all_gather_object use it."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=ranks.rank, world_size=ranks.world_size, device_id=device)
    else:
        dist.init_process_group("gloo", rank=ranks.rank, world_size=ranks.world_size)


def shard_tokens(path: str | Path) -> int:
    """The number of tokens in a shard, from its header alone (no tensor is read)."""
    with safe_open(str(path), framework="pt") as f:
        if "input_ids" not in f.keys():
            return 0  # load_batch names the missing tensor when the shard's rank reads it
        shape = f.get_slice("input_ids").get_shape()
    return int(shape[0]) if shape else 0


def share_shards(token_counts: Sequence[int], world_size: int) -> list[list[int]]:
    """Shard indices per rank, balanced by tokens: the longest shard first goes to
    the rank with the fewest tokens so far (ties: the lower shard index, the lower
    rank), each rank's list in shard order. Deterministic, so every rank computes the
    same split without talking. With fewer shards than ranks, some ranks get none."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    loads, shares = [0] * world_size, [[] for _ in range(world_size)]
    for index in sorted(range(len(token_counts)), key=lambda i: (-token_counts[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        loads[rank] += token_counts[index]
        shares[rank].append(index)
    return [sorted(share) for share in shares]


class RankFailed(RuntimeError):
    """Another rank raised: this rank stops too, naming it."""


@contextmanager
def all_ranks_or_none(
    ranks: Ranks, stage: str, bad_input=lambda error: isinstance(error, ValueError)
) -> Iterator[None]:
    """Run a stage on every rank; if any rank raises, every rank raises when the
    stage ends: the failing rank its own error, the others RankFailed, naming the rank
    and its message (RankFailedBadInput, a ValueError too, where the failing rank's
    error was bad_input(error): the caller's classification, e.g. the CLIs' one-line
    errors). Outside torch.distributed this is a plain block."""
    if not ranks.distributed:
        yield
        return
    error = None
    try:
        yield
    except Exception as caught:  # noqa: BLE001 - every error must reach the other ranks
        error = caught
    message = None if error is None else (type(error).__name__, " ".join(str(error).split()), bad_input(error))
    messages = [None] * ranks.world_size
    dist.all_gather_object(messages, message)
    if error is not None:
        raise error
    for rank, failed in enumerate(messages):
        if failed is not None:
            kind, text, was_bad_input = failed
            raise (RankFailedBadInput if was_bad_input else RankFailed)(f"rank {rank} ({stage}): {kind}: {text}")


class RankFailedBadInput(RankFailed, ValueError):
    """Another rank rejected its input: reported as bad input (one line, exit 2)."""


def all_reduce_timing(timing: dict[str, float], device: torch.device) -> dict[str, float]:
    """Timing across ranks: tokens summed, seconds the slowest rank's (the evaluation
    ends when it does), and the rates from those; likewise the steady part after each
    rank's first batch (which holds the compile)."""
    if not (dist.is_available() and dist.is_initialized()):
        return timing
    names = ("tokens", "after_first_tokens"), ("seconds", "first_batch_s", "after_first_s")
    summed, slowest = (torch.tensor([float(timing[n]) for n in group], dtype=torch.float64, device=device)
                       for group in names)  # fmt: skip
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    out = dict(zip(names[0], (int(x) for x in summed.tolist()), strict=True))
    out |= dict(zip(names[1], slowest.tolist(), strict=True))
    return out | {"tokens_per_s": out["tokens"] / out["seconds"], "ranks": dist.get_world_size()}
