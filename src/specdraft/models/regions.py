"""Nested compile regions (torch.compiler.nested_compile_region).

A region is traced and compiled once per distinct input signature and then called
again wherever it repeats, so the target's N decoder layers and the draft's K steps
compile one layer's code, not N + K copies: see specdraft.models.layers for which
parts of a layer are regions. In eager mode a region is a plain call.
SPECDRAFT_COMPILE_REGIONS=0 (read at import) turns them off.
"""

from __future__ import annotations

import functools
import os

import torch


def _no_region(fn):
    return fn


# torch >= 2.8 has it; the bare form (no options) is what torch 2.11 accepts too.
nested_region = getattr(torch.compiler, "nested_compile_region", None) or _no_region
if os.environ.get("SPECDRAFT_COMPILE_REGIONS", "1") == "0":
    nested_region = _no_region


def compile_region(fn):
    """A nested compile region for inference only. Where autograd records (a compiled
    training step through the heads), the plain function runs instead: torch 2.13's
    Inductor returns wrong weight gradients through a region that one graph calls more
    than once (the gate / up projections of SwiGLU off by ~10%; eager and aot_eager
    are right; tests/models/test_region_gradients.py). Under torch.compile the grad
    mode is a guarded constant, so the choice costs nothing at run time."""
    region = nested_region(fn)
    if region is fn:
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.is_grad_enabled():
            return fn(*args, **kwargs)
        return region(*args, **kwargs)

    return call
