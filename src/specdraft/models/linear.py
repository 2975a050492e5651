"""nn.Linear, with a reduction form for few fp32 rows on CUDA inside a compile.

At 6-16 rows cuBLAS picks a general FFMA GEMM for fp32 (37 µs for the demo pair's
256 x 768 MLP projection on an H200, profiled with benchmarks/bench_tree_batch.py
--profile) where one row takes a 2.3 µs GEMV: a verify forward of a few tokens then
costs several times a decode step, which is most of the gap between a chain's
acceptance length and its speed-up on the demo pair. Written as a product and a
sum over the input features, the projection is a reduction Inductor generates
itself (and fuses with its neighbours), about as fast at 16 rows as at one.

Only where all of these hold, so nothing else changes:
- inside torch.compile (eagerly the product would be materialised: rows x out x in);
- fp32 on CUDA (bf16 / fp16 GEMMs at few rows are cuBLAS's GEMV-like kernels, and on
  CPU the BLAS call is the fast one);
- a static row count of at most SMALL_ROWS (a symbolic one would need a guard).

SPECDRAFT_SMALL_LINEAR=blas (read at import) keeps cuBLAS everywhere, for
side-by-side benches.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.symbolic_shapes import statically_known_true

SMALL_ROWS = 16
REDUCTION_DEVICES = ("cuda",)  # tests add "cpu" to see the CUDA graph's structure on a CPU
SMALL_LINEAR_FORM = os.environ.get("SPECDRAFT_SMALL_LINEAR", "reduction")
if SMALL_LINEAR_FORM not in ("reduction", "blas"):
    raise ValueError(f"SPECDRAFT_SMALL_LINEAR must be reduction or blas, got {SMALL_LINEAR_FORM!r}")


def rows_of(x: torch.Tensor):
    """The rows a linear over x's last dimension multiplies: an int, or a SymInt."""
    rows = 1
    for size in x.shape[:-1]:
        rows = rows * size
    return rows


def takes_reduction_form(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` writes x @ weight.T as a reduction (the module docstring's
    conditions)."""
    if SMALL_LINEAR_FORM != "reduction" or not torch.compiler.is_compiling():
        return False
    if x.device.type not in REDUCTION_DEVICES or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    # Known without a guard: true for static shapes, false for a symbolic row count
    # (isinstance(rows, int) would not tell: Dynamo answers it True for a SymInt).
    return statically_known_true(rows_of(x) <= SMALL_ROWS)


def linear_as_reduction(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T (+ bias) as an elementwise product summed over the input
    features: [..., in] x [out, in] -> [..., out]."""
    out = (x.unsqueeze(-2) * weight).sum(-1)
    return out if bias is None else out + bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, or its reduction form where `takes_reduction_form`."""
    if takes_reduction_form(x, weight):
        return linear_as_reduction(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters, names and state dict) whose forward is `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
