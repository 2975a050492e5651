"""Draft-tree structure: the ops a tree iteration runs to grow its draft tree and
lay it out for the model, besides the model and the verifier
(ops/sampling/tree_verify.py); the accepted path's KV is moved by
ops/tree_commit_kv.py. One file per op, each with its Triton kernel, its torch
reference, the registered op and its public wrapper:

- expand.py, `tree_expand`: one EAGLE-2 expansion step (the children's cumulative
  scores and the best k of them);
- select.py, `tree_select`: the tree kept from an EAGLE-2 candidate pool;
- ancestors.py, `tree_ancestors`: the ancestor mask, the tree attention mask;
- positions.py, `tree_positions`: the rotary positions of tree nodes;
- ranking.py: the stable ranking the expand and select references share.
"""

from .ancestors import tree_ancestors
from .expand import tree_expand
from .positions import tree_positions
from .select import SelectedTree, tree_select

__all__ = ["SelectedTree", "tree_ancestors", "tree_expand", "tree_positions", "tree_select"]
