"""Budgeted verification's allocation: which drafted positions of a batch to verify
under one token budget, as one op (`budget_keep`).

values[b, i] is the expected gain of verifying drafted position i of request b: the
product of the survival estimates along its path (the caller computes it, so a child
never has a larger value than its parent). depths[b, i] is its depth (a chain: i; a
tree: its parent's depth + 1). A position is *eligible* iff its value is >= 0 (-0.0
counts as 0); a negative or NaN value is never kept, which is how the caller marks
finished requests and positions past a request's room.

The op keeps exactly min(max(budget, 0), number of eligible positions) positions: the
first ones in the total order

    value descending, then depth ascending, then b ascending, then i ascending

(values compared as floats: -0.0 ties with 0.0). counts[b] is how many of request b's
positions are kept.

Closure: where the caller's precondition holds (values non-increasing from a node to
its children, and an ineligible node's descendants ineligible), the kept set is closed
under predecessors / ancestors: a parent comes before its child in the order (a
larger value, or the same value and a lower depth). So each request verifies a prefix
of its chain, or a subtree holding the root's side of every kept node. The op cannot
see parents and does not check this; it is the caller's.

Zero-value positions are eligible and kept when the budget allows, so an unlimited
budget (any budget >= B * N) keeps every eligible position: today's fixed K / N.

The budget is a 0-dim device tensor, read by the kernel: one compiled graph (and one
CUDA graph) serves every budget value, with no host sync.

Depths are in [0, N] (a chain's are below N; a tree of N nodes is at most N deep); a
depth outside is a contract violation (checked mode refuses it), which the op clamps
into [0, N].

Files: kernel.py (the Triton kernel), reference.py (the torch reference), op.py (the
registered op, its public wrapper and checked mode's value checker).
"""

from .op import BudgetKeep, budget_keep, check_budget_keep_values
from .reference import budget_keep_reference

__all__ = ["BudgetKeep", "budget_keep", "budget_keep_reference", "check_budget_keep_values"]
