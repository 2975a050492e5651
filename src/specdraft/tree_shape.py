"""TreeShape, the three numbers of an EAGLE-2 draft tree, with its checks: plain
Python (no torch), so that a command line can refuse a bad `--tree` before it
imports torch. The tree build itself is specdraft.proposers.tree_build."""

from __future__ import annotations

from dataclasses import dataclass

MAX_DEPTH, MAX_TOPK, MAX_VERIFY_TOKENS = 8, 8, 64


def check_count(name: str, value: object, low: int, high: int) -> None:
    """A ValueError naming `name` unless value is a Python int in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


@dataclass(frozen=True)
class TreeShape:
    """depth D (draft steps, 1..8), topk (children per expansion, 1..8) and
    num_verify_tokens N (the tree the target verifies, root included, 2..64). N - 1
    must not exceed the pool (topk + (D - 1) * topk**2 nodes): a tree cannot keep
    more nodes than were drafted. topk = 1 with N = D + 1 is the chain."""

    depth: int
    topk: int
    num_verify_tokens: int

    def __post_init__(self) -> None:
        check_count("depth", self.depth, 1, MAX_DEPTH)
        check_count("topk", self.topk, 1, MAX_TOPK)
        check_count("num_verify_tokens", self.num_verify_tokens, 2, MAX_VERIFY_TOKENS)
        if self.num_verify_tokens - 1 > self.pool_size:
            raise ValueError(
                f"num_verify_tokens: {self.num_verify_tokens} needs {self.num_verify_tokens - 1} drafted nodes, but "
                f"depth {self.depth} with topk {self.topk} drafts {self.pool_size} "
                f"(topk + (depth - 1) * topk**2)"
            )

    @property
    def pool_size(self) -> int:
        return self.topk + (self.depth - 1) * self.topk**2
