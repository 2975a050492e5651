"""The suite's poisoned torch.empty (tests/conftest.py) is safe for every dtype torch
can allocate: torch's own callers go through it too (Inductor asks for
torch.empty((), dtype=torch.int16) while scheduling), so a fill that overflows a
narrow dtype would fail tests that have nothing to do with it (issue 24: every CUDA
compile test died on int16). Where it poisons, the value is the documented one."""

import pytest
import torch


def allocatable(dtype: torch.dtype) -> bool:
    """Whether torch itself (no poison) allocates this dtype: the quantized and some
    bit types it refuses are left out of the parametrisation, not skipped."""
    try:
        torch.empty((3,), dtype=dtype)  # at collection: the real torch.empty, not yet poisoned
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True


ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
ALLOCATABLE = [d for d in ALL_DTYPES if allocatable(d)]


def test_the_sweep_covers_the_narrow_dtypes():
    assert {torch.int16, torch.uint8, torch.int8, torch.bool, torch.float8_e4m3fn} <= set(ALLOCATABLE)


@pytest.mark.parametrize("dtype", ALLOCATABLE, ids=str)
@pytest.mark.parametrize("shape", [(), (5,)])
def test_every_dtype_allocates(dtype, shape, device):
    out = torch.empty(shape, dtype=dtype, device=device)
    assert out.dtype == dtype and out.shape == shape


# The widths in bytes (iinfo) and the pattern: 0x5A.. negated for signed, 0xA5.. unsigned.
POISONED = [
    (torch.int8, -0x5A),
    (torch.int16, -0x5A5A),
    (torch.int32, -0x5A5A5A5A),
    (torch.int64, -0x5A5A5A5A5A5A5A5A),
    (torch.uint8, 0xA5),
]


@pytest.mark.parametrize(("dtype", "value"), POISONED, ids=str)
def test_integer_poison_fits_the_dtype(dtype, value, device):
    out = torch.empty((), dtype=dtype, device=device)  # Inductor's own call shape
    assert int(out) == value
    assert torch.iinfo(dtype).min <= value <= torch.iinfo(dtype).max


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.complex64])
def test_floats_are_nan(dtype, device):
    assert torch.isnan(torch.empty(4, dtype=dtype, device=device)).all()


def test_bool_is_true(device):
    assert torch.empty(4, dtype=torch.bool, device=device).all()
