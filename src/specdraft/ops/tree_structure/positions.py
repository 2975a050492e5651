"""`tree_positions`: the rotary positions of tree nodes: their root's position plus
their depth, clamped below max_model_len (1-D or M-RoPE rows). One program per
M-RoPE row and request; the reference is the same computation in torch."""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checks import INDEX_DTYPES, check_int_range, check_tensor_arg

from ..backend import NAMESPACE, power_of_two_tile, tl, triton, use_triton


@triton.jit
def tree_positions_kernel(roots_ptr, depths_ptr, out_ptr, batch, n, last, N_PAD: tl.constexpr):
    # Program r: root row r (M-RoPE row r // batch of request r % batch).
    r = tl.program_id(0).to(tl.int64)
    b = r % batch
    nodes = tl.arange(0, N_PAD)
    in_tree = nodes < n
    root = tl.load(roots_ptr + r).to(tl.int64)
    depth = tl.load(depths_ptr + b * n + nodes, mask=in_tree, other=0).to(tl.int64)
    tl.store(out_ptr + r * n + nodes, tl.minimum(root + depth, last), mask=in_tree)


def tree_positions_reference(root_positions: torch.Tensor, depths: torch.Tensor, max_model_len: int) -> torch.Tensor:
    return (root_positions.long()[..., None] + depths.long()).clamp(max=max_model_len - 1)


@triton_op(f"{NAMESPACE}::tree_positions", mutates_args=())
def _tree_positions_op(root_positions: torch.Tensor, depths: torch.Tensor, max_model_len: int) -> torch.Tensor:
    if not use_triton(depths):
        return tree_positions_reference(root_positions, depths, max_model_len)
    batch, n = depths.shape
    out = torch.empty((*root_positions.shape, n), dtype=torch.int64, device=depths.device)
    if out.numel() > 0:
        wrap_triton(tree_positions_kernel)[(root_positions.numel(),)](
            root_positions, depths, out, batch, n, max_model_len - 1, N_PAD=power_of_two_tile(n, smallest=16),
        )  # fmt: skip
    return out


def tree_positions(root_positions: torch.Tensor, depths: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Rotary positions of tree nodes: root_positions + depth, clamped to
    max_model_len - 1 (a node past it can never be accepted; the clamp keeps its
    rotary lookup in range).

    Args:
        root_positions: [B] or M-RoPE [3, B] int32/int64, each request's root position
            (every row shifted alike).
        depths: [B, N] int32/int64, each node's depth below its root.
        max_model_len: Python int >= 1.

    Returns:
        [B, N] (or [3, B, N]) int64.
    """
    check_tensor_arg("depths", depths, INDEX_DTYPES, shape=(None, None), contiguous=True)
    batch = depths.shape[0]
    rows = (batch,) if root_positions.dim() == 1 else (3, batch)
    check_tensor_arg("root_positions", root_positions, INDEX_DTYPES, shape=rows, contiguous=True, device_of=depths)
    check_int_range("max_model_len", max_model_len, 1, 2**62)
    return _tree_positions_op(root_positions, depths, max_model_len)
