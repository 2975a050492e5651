"""materialize: an opaque copy, so that a compiled graph holds the tensor as a buffer.

Why: FlexAttention's lowering in Inductor (torch 2.11 on CUDA, 2.13 on CPU) builds
its mask subgraph before it realises the tensors a mask_mod captures. A capture that
is still an unstored expression (a pointwise or a small unrolled reduction, such as a
sequence id counted from cu_seqlens inside the graph) is inlined into the flex
template, where Triton codegen crashes ("'function' object has no attribute 'graph'")
and the CPU template finds no choice (NoValidChoicesError). Inductor cannot see
through a custom op, so its output is always a stored buffer. The copy costs one
pass over a [T]-sized index tensor.
"""

from __future__ import annotations

import torch

from specdraft.ops.backend import NAMESPACE


@torch.library.custom_op(f"{NAMESPACE}::materialize", mutates_args=())
def _materialize_op(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_materialize_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def materialize(x: torch.Tensor) -> torch.Tensor:
    """A copy of x that Inductor stores as a buffer of its own (module docstring).

    Args:
        x: an integer or bool tensor, any shape. Floating and complex tensors are refused:
            the op has no autograd formula, and the tensors it is for (mask captures) carry
            no gradient.

    Returns:
        A copy of x (x.clone()): same shape, dtype and device.
    """
    if x.is_floating_point() or x.is_complex():
        raise ValueError(f"x must be an integer or bool tensor, got {x.dtype}")
    return _materialize_op(x)
