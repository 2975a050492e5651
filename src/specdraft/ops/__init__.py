"""specdraft.ops: the kernel layer. Each op is a `torch.library.triton_op` in the
`specdraft` namespace: CUDA tensors run its Triton kernel, CPU tensors its pure-torch
reference. This package imports torch, triton and the bottom layer (specdraft.layout,
specdraft.checks, specdraft.checked_mode, specdraft.value_checks) only; what several
families share lives in ops/common."""

from .backend import HAS_TRITON, quiet_without_triton

with quiet_without_triton():
    from .budget import BudgetKeep, budget_keep
    from .copy_and_expand import ExpandedInputs, copy_and_expand_inputs
    from .markov_block import markov_block_sample
    from .paged_attention import masked_paged_attention
    from .parallel_drafting import ExtendedQueries, extend_queries_by_n, new_slot_mapping
    from .prepare_eagle import EagleInputs, prepare_eagle_input
    from .prepare_inputs import NextTokens, PaddedInputs, prepare_inputs_padded, prepare_next_token_padded
    from .sampling import AcceptedPath, draft_sample, noise_uniform, rejection_sample, tree_verify, truncation_cut
    from .shift_and_cache import MAX_SHIFT_LIMIT, shift_and_cache_1d, shift_and_cache_hidden
    from .shift_plan import ShiftPlan, shift_plan
    from .step_metadata import PADDING_SLOT_ID, step_metadata
    from .top_logprobs import top_logprobs
    from .tree_commit_kv import tree_commit_kv
    from .tree_structure import SelectedTree, tree_ancestors, tree_expand, tree_positions, tree_select
    from .vocab_metrics import VocabMetrics, vocab_metrics

__all__ = [
    "HAS_TRITON",
    "MAX_SHIFT_LIMIT",
    "ShiftPlan",
    "shift_and_cache_1d",
    "shift_and_cache_hidden",
    "shift_plan",
    # prepare_eagle, prepare_inputs, step_metadata
    "EagleInputs",
    "NextTokens",
    "PaddedInputs",
    "PADDING_SLOT_ID",
    "prepare_eagle_input",
    "prepare_inputs_padded",
    "prepare_next_token_padded",
    "step_metadata",
    # parallel drafting
    "ExpandedInputs",
    "ExtendedQueries",
    "copy_and_expand_inputs",
    "extend_queries_by_n",
    "new_slot_mapping",
    # sampling
    "draft_sample",
    "noise_uniform",
    "rejection_sample",
    "AcceptedPath",
    "tree_verify",
    "truncation_cut",
    # attention over the paged KV cache
    "masked_paged_attention",
    # block drafters' Markov head
    "markov_block_sample",
    # budgeted verification's allocation
    "BudgetKeep",
    "budget_keep",
    # draft-tree structure
    "SelectedTree",
    "tree_ancestors",
    "tree_positions",
    "tree_commit_kv",
    "tree_expand",
    "tree_select",
    "top_logprobs",
    # training-time draft metrics
    "VocabMetrics",
    "vocab_metrics",
]
