"""nn.Linear, with a reduction form for few fp32 rows on CUDA inside a compile.

cuBLAS picks a general FFMA GEMM for fp32 at a few rows: on an H200 26-53 µs at 8
rows for the demo pair's projections, where one row takes a 2-3 µs GEMV
(benchmarks/bench_small_linear.py), so a verify forward of a few tokens costs several
times a decode step. Written as a product and a sum over the input features, the
projection is a reduction Inductor generates itself: 1.5-3.1 µs at 1-8 rows and
1.8-4.9 µs at 16 (where cuBLAS's choice varies, 3.3-53 µs).

Only where all of these hold, so nothing else changes:
- inside torch.compile (eagerly the product would be materialised: rows x out x in);
- fp32 on CUDA (bf16 / fp16 GEMMs at few rows are cuBLAS's GEMV-like kernels, and on
  CPU the BLAS call is the fast one);
- a static row count of at most SMALL_ROWS (a symbolic one would need a guard).

Opt-in for now: SPECDRAFT_SMALL_LINEAR=reduction (read at import) turns it on; the
default, blas, keeps cuBLAS everywhere, because the demo pair's shipped step-cost and
tree-cost tables (generation/demo_pair_*.json) and their side-by-side figures were
measured with cuBLAS, and a faster verify at few rows changes what they should pick
at B <= 4.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.symbolic_shapes import statically_known_true

SMALL_ROWS = 16
REDUCTION_DEVICES = ("cuda",)  # tests add "cpu" to see the CUDA graph's structure on a CPU
SMALL_LINEAR_FORM = os.environ.get("SPECDRAFT_SMALL_LINEAR", "blas")
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
