"""`tree_ancestors`: the ancestor mask [B, N, N] of a parent array (node j is node i
or an ancestor of it): the draft's and the target's tree attention mask. One program
per request (N <= 64 fits its registers); the reference is the same closure in
torch."""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checks import INDEX_DTYPES, at_least, check_tensor_arg

from ..backend import NAMESPACE, power_of_two_tile, tl, triton, use_triton


@triton.jit
def tree_ancestors_kernel(parents_ptr, out_ptr, n, N_PAD: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    nodes = tl.arange(0, N_PAD)
    in_tree = nodes < n
    block = out_ptr + b * n * n
    tl.store(block + nodes[:, None] * n + nodes[None, :], tl.zeros([N_PAD, N_PAD], tl.int1),
             mask=in_tree[:, None] & in_tree[None, :])  # fmt: skip
    tl.debug_barrier()
    # Lane i walks from node i up to the root, marking each node it passes; a parent
    # outside [0, n) ends the walk as the root's -1 does. n steps cover any path.
    # int64 throughout: a loop-carried value must keep one type (a compiled kernel
    # refuses int32 -> int64; the interpreter does not check).
    current = nodes.to(tl.int64)
    live = in_tree
    for _ in range(0, n):
        tl.store(block + nodes * n + current, tl.full([N_PAD], 1, tl.int1), mask=live)
        up = tl.load(parents_ptr + b * n + current, mask=live, other=-1).to(tl.int64)
        live = live & (up >= 0) & (up < n)
        current = tl.where(live, up, 0)


def tree_ancestors_reference(parents: torch.Tensor) -> torch.Tensor:
    """The reflexive-transitive closure of "j is i's parent", by squaring: after s
    squarings every path of up to 2**s steps is covered."""
    batch, n = parents.shape
    inside = (parents >= 0) & (parents < n)
    closure = torch.eye(n, device=parents.device).expand(batch, n, n).clone()
    edges = torch.zeros_like(closure).scatter_(2, torch.where(inside, parents, 0).long()[..., None],
                                               inside.float()[..., None])  # fmt: skip
    closure = torch.maximum(closure, edges)
    for _ in range(max(1, (n - 1).bit_length())):
        closure = ((closure @ closure) > 0).float()
    return closure > 0


@triton_op(f"{NAMESPACE}::tree_ancestors", mutates_args=())
def _tree_ancestors_op(parents: torch.Tensor) -> torch.Tensor:
    if not use_triton(parents):
        return tree_ancestors_reference(parents)
    batch, n = parents.shape
    out = torch.empty((batch, n, n), dtype=torch.bool, device=parents.device)
    if batch > 0:
        wrap_triton(tree_ancestors_kernel)[(batch,)](parents, out, n, N_PAD=power_of_two_tile(n, smallest=16))
    return out


def tree_ancestors(parents: torch.Tensor) -> torch.Tensor:
    """[B, N, N] bool: node j is node i or one of its ancestors.

    Args:
        parents: [B, N] int32/int64, each node's parent index, -1 for the root; a
            parent outside [0, N) ends the path as -1 does.

    Returns:
        The ancestor mask, reflexive: out[b, i, i] is True for every node.
    """
    check_tensor_arg("parents", parents, INDEX_DTYPES, shape=(None, at_least(1, "N")), contiguous=True)
    return _tree_ancestors_op(parents)
