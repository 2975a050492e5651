"""log2, exp2 and 1 / x in fp32, as the SFU computes them on CUDA (FAST) or exactly
(the interpreter has no inline PTX). The noise transform, the samplers' races and
every online softmax of a vocabulary scan use them."""

from ..backend import TRITON_INTERPRET, tl, triton

FAST_LOG2 = not TRITON_INTERPRET  # the interpreter has no inline PTX: exact log2 there


@triton.jit
def log2(x, FAST: tl.constexpr):
    """log2 of a positive normal fp32; FAST: the SFU instruction (lg2.approx,
    about 2**-22 relative error), one issue slot instead of libdevice's polynomial."""
    if FAST:
        return tl.inline_asm_elementwise(
            "lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.log2(x)


@triton.jit
def exp2(x, FAST: tl.constexpr):
    """2**x; FAST: the SFU instruction (ex2.approx.ftz, 2 ulp)."""
    if FAST:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.exp2(x)


@triton.jit
def rcp(x, FAST: tl.constexpr):
    """1 / x; FAST: the SFU instruction (rcp.approx.ftz, 1 ulp) instead of a division."""
    if FAST:
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return 1.0 / x
