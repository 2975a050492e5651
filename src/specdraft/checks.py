"""Argument checks shared by every op wrapper.

They read shapes, dtypes and devices only, so they cost nothing at run time and hold
under torch.compile (no host sync). Each raises a ValueError naming the argument.
"""

from collections.abc import Iterable

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_true

INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_dtype(name: str, tensor: torch.Tensor, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    check_tensor(name, tensor)
    if tensor.dtype not in allowed:
        raise ValueError(f"{name} must have dtype in ({_names(allowed)}), got {tensor.dtype}")


def check_same_dtype(name: str, tensor: torch.Tensor, like_name: str, like: torch.Tensor) -> None:
    if tensor.dtype != like.dtype:
        raise ValueError(f"{name} must have the dtype of {like_name} ({like.dtype}), got {tensor.dtype}")


def check_rank(name: str, tensor: torch.Tensor, ranks: int | Iterable[int]) -> None:
    ranks = (ranks,) if isinstance(ranks, int) else tuple(ranks)
    if tensor.dim() not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{name} must be {want}-D, got shape {tuple(tensor.shape)}")


def same_size(got, want) -> bool:
    """got == want for sizes; a symbolic size the compiler cannot decide (an unbacked
    size under torch.compile) counts as equal instead of failing to guard."""
    return guard_or_true(got == want)


def check_shape(name: str, tensor: torch.Tensor, shape: tuple) -> None:
    message = f"{name} must have shape {tuple(shape)}, got {tuple(tensor.shape)}"
    if tensor.dim() != len(shape):
        raise ValueError(message)
    for got, want in zip(tensor.shape, shape, strict=True):
        if not same_size(got, want):
            raise ValueError(message)


def check_contiguous(name: str, tensor: torch.Tensor) -> None:
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_same_device(tensors: dict[str, torch.Tensor]) -> None:
    items = list(tensors.items())
    first_name, first = items[0]
    for name, tensor in items[1:]:
        if tensor.device != first.device:
            raise ValueError(
                f"{name} is on {tensor.device} but {first_name} is on {first.device}: all tensors must be on one device"
            )


def check_distinct(name: str, tensor: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
    if tensor is other:
        raise ValueError(f"{name} and {other_name} must be different tensors")


def check_int_range(name: str, value: int, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | torch.SymInt):
        raise ValueError(f"{name} must be an int, got {type(value).__name__}")
    if isinstance(value, int) and (value < low or (high is not None and value > high)):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be in {bound}, got {value}")
