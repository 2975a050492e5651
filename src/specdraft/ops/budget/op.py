"""`budget_keep`, the registered op, its public wrapper and checked mode's value
checker: CUDA tensors launch kernel.py's kernel, CPU tensors run reference.py's
torch."""

from typing import NamedTuple

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import INDEX_DTYPES, at_least, check_tensor_arg
from specdraft.value_checks import check_in_range

from ..backend import NAMESPACE, TRITON_INTERPRET, cdiv, next_power_of_2, use_triton
from .kernel import budget_keep_kernel
from .reference import budget_keep_reference

# Positions the kernel holds in registers (the first tile; a larger batch loops over
# tiles): 16384 covers B = 256 at N = 64 in one tile. The interpreter emulates every
# lane in NumPy: small tiles there keep it fast and make small batches span several.
# Warps: 16 positions a thread (ptxas for sm_90: the 16384 tile on 32 warps takes 64
# registers and spills 32 bytes; 8192 on 8 warps, 32 a thread, 255 and spills 164).
GPU_MAX_TILE = 16384
MAX_TILE = 256 if TRITON_INTERPRET else GPU_MAX_TILE
TIE_LIMIT = 2**31  # (N + 1) * B * N, the tie keys' range, stays below it (int32 keys)


class BudgetKeep(NamedTuple):
    keep: torch.Tensor  # [B, N] bool: the positions to verify
    counts: torch.Tensor  # [B] int32: kept positions per request


def tiles(num_reqs: int, num_pos: int) -> tuple[int, int, int]:
    """(ROWS, COLS, NUM_TILES): the kernel's tile [ROWS, COLS] and how many cover B rows."""
    cols = next_power_of_2(num_pos)
    fit = max(1, MAX_TILE // cols)
    rows = min(next_power_of_2(num_reqs), 1 << (fit.bit_length() - 1))  # powers of two (tl.arange)
    return rows, cols, cdiv(num_reqs, rows)


def _outputs(num_reqs, num_pos, device):
    keep = torch.empty((num_reqs, num_pos), dtype=torch.bool, device=device)
    return keep, torch.empty((num_reqs,), dtype=torch.int32, device=device)


def _launch(values, depths, budget):
    num_reqs, num_pos = values.shape
    keep, counts = _outputs(num_reqs, num_pos, values.device)
    if num_reqs == 0:
        return keep, counts
    rows, cols, num_tiles = tiles(num_reqs, num_pos)
    wrap_triton(budget_keep_kernel)[(1,)](
        values, depths, budget, keep, counts, num_reqs, num_pos, ROWS=rows, COLS=cols, NUM_TILES=num_tiles,
        num_warps=max(1, min(32, rows * cols // 512)),
    )  # fmt: skip
    return keep, counts


@triton_op(f"{NAMESPACE}::budget_keep", mutates_args=())
def _budget_keep_op(
    values: torch.Tensor, depths: torch.Tensor, budget: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if not use_triton(values):
        return budget_keep_reference(values, depths, budget)
    return _launch(values, depths, budget)


@_budget_keep_op.register_fake
def _budget_keep_fake(values, depths, budget):
    return _outputs(*values.shape, values.device)


# ------------------------------------------------------------------ public wrapper


def budget_keep(values: torch.Tensor, depths: torch.Tensor, budget: torch.Tensor) -> BudgetKeep:
    """The drafted positions to verify under one token budget for the whole batch
    (the package docstring, specdraft.ops.budget, gives the order and its closure
    under prefixes and ancestors).

    Keeps exactly min(max(budget, 0), #eligible) positions, the best in the order
    value descending, then depth ascending, then b, then i; a position is eligible iff
    its value is >= 0 (negative or NaN: never kept). Zero-value positions are kept
    when the budget allows, so an unlimited budget keeps every eligible position.
    Where values never increase from a node to its children (the caller's
    precondition: the op cannot see parents), the kept set is closed under
    predecessors / ancestors.

    No host sync: the budget stays on the device, one compiled graph serves every
    budget value. One kernel launch on CUDA (one program, no sort).

    Args:
        values: [B, N] fp32, contiguous: the expected gain of verifying each drafted
            position (the product of survival estimates along its path); < 0 or NaN
            marks a position never to verify. N >= 1, B * N * (N + 1) < 2**31.
        depths: [B, N] int32/int64, contiguous: each position's depth in [0, N] (a
            chain: i; a tree: the parent's depth + 1); a depth outside is a contract
            violation (checked mode refuses it), which the op clamps into [0, N].
        budget: 0-dim int32/int64 tensor on the values' device: the positions to keep
            over the whole batch; a negative budget keeps none.

    Returns:
        BudgetKeep(keep [B, N] bool, counts [B] int32 = keep.sum(1)).
    """
    check_tensor_arg("values", values, torch.float32, shape=(None, at_least(1, "N")), contiguous=True)
    num_reqs, num_pos = values.shape
    if guard_or_false(num_reqs * num_pos * (num_pos + 1) >= TIE_LIMIT):
        raise ValueError(f"values: B * N * (N + 1) must be below 2**31, got shape {tuple(values.shape)}")
    check_tensor_arg("depths", depths, INDEX_DTYPES, shape=(num_reqs, num_pos), contiguous=True, device_of=values)
    check_tensor_arg("budget", budget, INDEX_DTYPES, rank=0, device_of=values)
    if is_checked():
        check_budget_keep_values(depths, num_pos)
    return BudgetKeep(*_budget_keep_op(values, depths, budget))


# --------------------------------------------- checked mode's value checks (syncs)


def check_budget_keep_values(depths: torch.Tensor, num_pos: int) -> None:
    """budget_keep: depths inside [0, N]. (That values never increase from a node to
    its children, which the kept set's closure rests on, is the caller's to hold: the
    op cannot see parents.)"""
    check_in_range("depths", depths, 0, num_pos + 1)
