"""Bench helpers that need neither a GPU nor triton, so a bench's CPU smoke run
imports them as its GPU run does: markdown tables and a timer that is the CUDA-graph
replay timer (harness.time_us) on CUDA and a wall-clock median on the CPU."""

import statistics
import time
from collections.abc import Callable


def one_decimal(value) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def markdown_table(headers: list[str], rows: list[list[object]], cell: Callable[[object], str] = one_decimal) -> str:
    """A markdown table, each cell formatted by `cell` (floats to one decimal by default)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def time_us(fn: Callable[[], object], device: str, cpu_repeats: int = 3) -> float:
    """Median µs per call: CUDA-graph replays on CUDA (harness.time_us, imported only
    there, since it needs triton), wall-clock calls after one warm-up on the CPU."""
    if device == "cuda":
        from harness import time_us as graph_time_us  # noqa: PLC0415  (triton: GPU runs only)

        return graph_time_us(fn)
    return wall_median_us(fn, cpu_repeats)


def wall_median_us(fn: Callable[[], object], repeats: int = 3) -> float:
    """Median wall-clock µs of `repeats` calls after one warm-up call (CPU timing)."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)
