"""Count what torch.compile did: graphs compiled and graph breaks.

Used by specdraft's own compile tests, and useful for an engine's: wrap a call in
`CompileCounts.measure()` and assert `graph_breaks == 0` and `compiles == 1`.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class CompileCounts:
    compiles: int = 0  # frames Dynamo compiled (a recompile or a graph break adds one)
    graph_breaks: int = 0

    @classmethod
    @contextmanager
    def measure(cls) -> Iterator["CompileCounts"]:
        from torch._dynamo.utils import counters

        counts = cls()
        frames_before = counters["stats"]["unique_graphs"]
        breaks_before = sum(counters["graph_break"].values())
        try:
            yield counts
        finally:
            counts.compiles = counters["stats"]["unique_graphs"] - frames_before
            counts.graph_breaks = sum(counters["graph_break"].values()) - breaks_before


def fresh_compile(fn, **options):
    """torch.compile(fn) after clearing Dynamo's caches, so counts start at zero."""
    torch._dynamo.reset()
    return torch.compile(fn, **options)
