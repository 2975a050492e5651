"""What every op file shares about Triton: whether it is importable, and which path a
tensor takes through an op body.

Without triton the package still imports: `triton.jit` becomes the identity and
`tl.constexpr` a placeholder, so kernel definitions parse, and every op body takes
its pure-torch reference.
"""

import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised by a subprocess test
    HAS_TRITON = False
    triton = SimpleNamespace(
        jit=lambda fn=None, **_: fn if fn is not None else (lambda f: f),
        next_power_of_2=lambda n: 1 << max(0, math.ceil(math.log2(max(1, n)))),
        cdiv=lambda a, b: (a + b - 1) // b,
    )
    tl = SimpleNamespace(constexpr=object)

# Read once: the interpreter swaps kernel launching for a NumPy emulation at
# definition time, so the variable only matters if set before import.
TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

NAMESPACE = "specdraft"


@contextmanager
def quiet_without_triton() -> Iterator[None]:
    """Defining a triton_op without triton installed makes torch log "Triton not
    available" once per op: 16 lines on every import of specdraft, about a path that is
    never taken (use_triton is False everywhere without triton). The op files are
    imported under this; with triton it does nothing."""
    logger = logging.getLogger("torch._library.triton")
    level = logger.level
    if not HAS_TRITON:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def use_triton(tensor: torch.Tensor) -> bool:
    """CUDA tensors run the Triton kernel; CPU tensors run the reference, except in the
    interpreter lane (TRITON_INTERPRET=1), where the kernel runs on CPU tensors."""
    if not HAS_TRITON:
        return False
    return tensor.device.type == "cuda" or (TRITON_INTERPRET and tensor.device.type == "cpu")


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def power_of_two_tile(size, smallest: int = 1, largest: int | None = None) -> int:
    """The smallest power of two >= size (at least `smallest`, at most `largest`), as a
    plain int found by comparisons: a tile is a constexpr, and under dynamic shapes
    (size a SymInt) each comparison is a guard on a range. triton.next_power_of_2 on a
    SymInt builds a bitwise expression instead, which torch 2.11's fake-tensor cache
    check evaluated one way statically and another by its hint under
    backed_size_oblivious (CUDA, tests/proposers/test_autoregressive_compile.py)."""
    tile = smallest
    while (largest is None or tile < largest) and size > tile:
        tile *= 2
    return tile


def next_power_of_2(n: int) -> int:
    return power_of_two_tile(n)
