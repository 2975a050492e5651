"""Nested compile regions (torch.compiler.nested_compile_region).

A region is traced and compiled once per distinct input signature and then called
again wherever it repeats, so the target's N decoder layers and the draft's K steps
compile one layer's code, not N + K copies: see specdraft.models.layers for which
parts of a layer are regions. In eager mode a region is a plain call.
SPECDRAFT_COMPILE_REGIONS=0 (read at import) turns them off.

Two kinds of region:
- the paged attention and the MLP, always but in a trace with dynamic shapes
  (models.cache_attention, layers.SwiGLU; see tracing_dynamic_shapes);
- a layer's parts before and after its attention (the norms, projections and RoPE;
  o_proj, the residual and the MLP: layers.DecoderLayer), only inside
  `layer_regions()`, which SpeculativeDecoder's compiled calls run in (static
  shapes). They read float attributes (a norm's eps, RoPE's theta), which
  torch.compile(dynamic=True) turns into symbols, and a region reading such a symbol
  cannot be called a second time (torch 2.13: "invoke_subgraph operands must be a
  list of tensors/ints/SymInts"); a float subclass kept constant would do on torch
  2.13 but torch 2.11 cannot pass one into a region. So a compile with dynamic
  shapes (the training evaluator, a user's dynamic=True propose) must not use them,
  and does not unless it runs inside layer_regions(). Dynamo reads the switch while
  tracing and guards on it: a graph traced with it on is used only with it on.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

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
        if torch.is_grad_enabled() or tracing_dynamic_shapes():
            return fn(*args, **kwargs)
        return region(*args, **kwargs)

    return call


def tracing_dynamic_shapes() -> bool:
    """Whether torch.compile(dynamic=True) is tracing (it turns Dynamo's
    assume_static_by_default off for its trace; Dynamo reads the setting as a
    constant, so the test is free). Such a trace inlines every region: torch 2.11's
    Inductor cannot compile one there (the split-KV attention region of an 8B-shaped
    propose compiled with dynamic=True sized a buffer by a symbol it never received:
    NameError "s91 is not defined" on the first call, on CUDA). Sizes are not asked
    directly: Dynamo answers isinstance(size, torch.SymInt) with False while tracing."""
    return not torch._dynamo.config.assume_static_by_default


LAYER_REGIONS = False  # see layer_regions(); module state that Dynamo guards on


@contextlib.contextmanager
def layer_regions() -> Iterator[None]:
    """Within: decoder layers compile their parts around the attention as regions too
    (see the module docstring). Only for calls compiled with static shapes."""
    global LAYER_REGIONS
    before, LAYER_REGIONS = LAYER_REGIONS, True
    try:
        yield
    finally:
        LAYER_REGIONS = before


def layer_regions_on() -> bool:
    return LAYER_REGIONS and nested_region is not _no_region


def in_layer_regions(fn):
    """fn (a torch.compile'd function with static shapes) called inside
    layer_regions(): its trace, and every call after it, see the switch on."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with layer_regions():
            return fn(*args, **kwargs)

    return call
