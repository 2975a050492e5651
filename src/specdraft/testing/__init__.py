"""Public helpers for testing code built on specdraft: Hypothesis strategies of valid
batch layouts, opt-in value checkers (these sync with the host: tests only), and
compile counters."""

from specdraft.testing.compile import CompileCounts, fresh_compile
from specdraft.testing.shift_and_cache import (
    ShiftLayout,
    check_shift_and_cache_values,
    shift_layouts,
)

__all__ = [
    "CompileCounts",
    "ShiftLayout",
    "check_shift_and_cache_values",
    "fresh_compile",
    "shift_layouts",
]
