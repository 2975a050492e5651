"""Count what torch.compile did: graphs compiled, graph breaks, and restarted
analyses.

Used by specdraft's own compile tests, and useful for an engine's: wrap a call in
`CompileCounts.measure()` and assert `graph_breaks == 0` and `compiles == 1`.
`restarts` counts the times Dynamo threw away a trace and began the frame again
(for example to hold a Python float constant that it had traced as a symbol): each
one repeats the trace, and its AOT pass, for nothing.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class CompileCounts:
    compiles: int = 0  # frames Dynamo compiled (a recompile or a graph break adds one)
    graph_breaks: int = 0
    restarts: int = 0  # traces begun again (Dynamo's second and later attempts at a frame)

    @classmethod
    @contextmanager
    def measure(cls) -> Iterator["CompileCounts"]:
        from torch._dynamo.utils import counters

        counts = cls()
        frames_before = counters["stats"]["unique_graphs"]
        breaks_before = sum(counters["graph_break"].values())
        restarts_before = attempts_after_the_first()
        try:
            yield counts
        finally:
            counts.compiles = counters["stats"]["unique_graphs"] - frames_before
            counts.graph_breaks = sum(counters["graph_break"].values()) - breaks_before
            counts.restarts = attempts_after_the_first() - restarts_before


def attempts_after_the_first() -> int:
    """Dynamo's timed attempts at a frame past the first ("compile_attempt_1" and
    later), over the process so far."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(len(times) for name, times in compilation_time_metrics.items()
               if name.startswith("compile_attempt_") and name != "compile_attempt_0")  # fmt: skip


def fresh_compile(fn, **options):
    """torch.compile(fn) after clearing Dynamo's caches, so counts start at zero."""
    torch._dynamo.reset()
    return torch.compile(fn, **options)
