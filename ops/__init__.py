"""specdraft.ops: the kernel layer. Each op is a `torch.library.triton_op` in the
`specdraft` namespace: CUDA tensors run its Triton kernel, CPU tensors its pure-torch
reference. This package imports torch and triton only."""

from ._triton import HAS_TRITON
from .shift_and_cache import (
    MAX_SHIFT_LIMIT,
    ShiftPlan,
    shift_and_cache_1d,
    shift_and_cache_hidden,
    shift_plan,
)

__all__ = [
    "HAS_TRITON",
    "MAX_SHIFT_LIMIT",
    "ShiftPlan",
    "shift_and_cache_1d",
    "shift_and_cache_hidden",
    "shift_plan",
]
