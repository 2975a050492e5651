"""Argument checks shared by every op wrapper.

They read shapes, dtypes and devices only, so they cost nothing at run time and hold
under torch.compile (no host sync). Each raises a ValueError naming the argument.
`check_tensor_arg` states everything asked of one tensor argument in one call.
"""

from collections.abc import Iterable

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false, guard_or_true

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


def check_int_range(name: str, value: int, low: int, high: int | None = None, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | torch.SymInt):
        raise ValueError(f"{name} must be an int, got {type(value).__name__}")
    if isinstance(value, int) and (value < low or (high is not None and value > high)):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be in {bound}, got {value}")


def check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {type(value).__name__}")


# ------------------------------------------------- declarative checks, one line per argument


class SizeRange:
    """A dimension that may take any size in [low, high] (high None: no upper bound), for
    the `shape` of `check_tensor_arg`; `label` names the dimension in error messages."""

    def __init__(self, low, high=None, label: str | None = None):
        self.low, self.high, self.label = low, high, label

    def admits(self, size) -> bool:
        # A symbolic size the compiler cannot decide counts as admitted, as in same_size.
        below = guard_or_false(size < self.low)
        above = self.high is not None and guard_or_false(size > self.high)
        return not (below or above)

    def __repr__(self) -> str:
        prefix = f"{self.label} " if self.label else ""
        if self.high is None:
            return f"{prefix}>= {self.low}"
        return f"{prefix}in [{self.low}, {self.high}]"


def at_least(low, label: str | None = None) -> SizeRange:
    return SizeRange(low, None, label)


def between(low, high, label: str | None = None) -> SizeRange:
    return SizeRange(low, high, label)


def _shape_text(shape: tuple) -> str:
    items = ["any" if d is None else repr(d) if isinstance(d, SizeRange) else str(d) for d in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _shape_ok(got: torch.Size, want: tuple) -> bool:
    return len(got) == len(want) and all(_dim_ok(g, w) for g, w in zip(got, want, strict=True))


def _dim_ok(got, want) -> bool:
    if want is None:
        return True
    if isinstance(want, SizeRange):
        return want.admits(got)
    return same_size(got, want)


def check_tensor_arg(
    name: str,
    tensor: object,
    dtypes: torch.dtype | Iterable[torch.dtype] | None = None,
    *,
    rank: int | Iterable[int] | None = None,
    shape: tuple | list[tuple] | None = None,
    contiguous: bool | str = False,
    device_of: torch.Tensor | None = None,
    distinct_from: dict[str, torch.Tensor] | None = None,
    optional: bool = False,
) -> None:
    """Everything an op wrapper asks of one tensor argument, checked from metadata only.

    dtypes: one dtype or several allowed. rank: allowed ranks.
    shape: one entry per dimension: a size (an int or a symbolic size, compared with
      same_size), None for any size, or a SizeRange (`at_least`, `between`); a list of
      such tuples allows any one of them.
    contiguous: True for `is_contiguous()`; "rows" for stride 1 along the last
      dimension (size-1 rows exempt), which never guards on the batch size.
    device_of: a tensor whose device this one must share.
    distinct_from: {name: tensor} that must not be this very tensor (buffers the op writes).
    optional: None passes.
    Raises a ValueError naming `name`.
    """
    if tensor is None and optional:
        return
    check_tensor(name, tensor)
    if dtypes is not None:
        check_dtype(name, tensor, (dtypes,) if isinstance(dtypes, torch.dtype) else dtypes)
    if rank is not None:
        check_rank(name, tensor, rank)
    if shape is not None:
        alternatives = shape if isinstance(shape, list) else [shape]
        if not any(_shape_ok(tensor.shape, want) for want in alternatives):
            want = " or ".join(_shape_text(w) for w in alternatives)
            raise ValueError(f"{name} must have shape {want}, got {tuple(tensor.shape)}")
    if contiguous == "rows":
        if tensor.dim() > 0 and tensor.stride(-1) != 1 and tensor.shape[-1] > 1:  # stride first: no guard
            raise ValueError(f"{name} must have contiguous rows (stride 1 along the last dimension)")
    elif contiguous:
        check_contiguous(name, tensor)
    for other_name, other in (distinct_from or {}).items():
        check_distinct(name, tensor, other_name, other)
    if device_of is not None and tensor.device != device_of.device:
        raise ValueError(
            f"{name} is on {tensor.device} but the other tensors are on {device_of.device}: "
            "all tensors must be on one device"
        )


def check_all_distinct(tensors: dict[str, torch.Tensor]) -> None:
    """No tensor passed twice: buffers an op writes must not alias each other."""
    names = list(tensors)
    for i, name in enumerate(names):
        for other_name in names[i + 1 :]:
            check_distinct(other_name, tensors[other_name], name, tensors[name])


def check_choice(name: str, value: object, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


def number_tensor(value, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[1] tensor of `dtype` holding a Python number argument (a temperature, a
    top-p, a top-k), equal to torch.full((1,), value, dtype=dtype). A float is built
    as ones * value: torch.compile(dynamic=True) traces a float argument as a symbol,
    which a product with a tensor keeps symbolic, while torch.full (or float(value))
    pins it to its value and makes Dynamo throw the whole trace away and start again.
    An int goes through torch.full, which refuses one its dtype cannot hold (a
    product would wrap it around silently)."""
    if isinstance(value, float):
        return torch.ones((1,), dtype=dtype, device=device) * value
    return torch.full((1,), value, dtype=dtype, device=device)
