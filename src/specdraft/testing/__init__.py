"""Public helpers for testing code built on specdraft.

Without any extra: the compile counters (`CompileCounts`, `fresh_compile`),
`make_draft_batch` (complete `propose()` inputs) and the value checkers of the ops
(checked mode's own, each beside its op in specdraft.ops, re-exported here and
loaded on first use; they sync with the host: development and tests only). With
hypothesis (`pip install "hypothesis>=6.100"`, what the testing extra needs; or
`pip install ".[testing]"` in a clone): the strategies of valid batch layouts and
their layout types, and the strategies of *invalid* ones, each tagged with the rule it breaks (invalid.py).

The hypothesis-backed names are loaded on first use (module `__getattr__`), so
`import specdraft.testing` never imports hypothesis; using one of them without it
raises an ImportError that names the extra.
"""

import importlib

from specdraft.testing.compile import CompileCounts, fresh_compile
from specdraft.testing.proposers import DraftBatch, make_draft_batch

# The ops' value checkers: name -> the op module defining it (beside its op). Loaded
# on first use, so `import specdraft.testing` imports neither the ops nor triton.
_VALUE_CHECKERS = {
    "check_budget_keep_values": "specdraft.ops.budget.op",
    "check_copy_and_expand_values": "specdraft.ops.copy_and_expand",
    "check_draft_sample_values": "specdraft.ops.sampling.draft",
    "check_extend_queries_values": "specdraft.ops.parallel_drafting",
    "check_logit_cut_values": "specdraft.ops.sampling.draft",
    "check_markov_block_sample_values": "specdraft.ops.markov_block.op",
    "check_masked_paged_attention_values": "specdraft.ops.paged_attention.op",
    "check_new_slot_mapping_values": "specdraft.ops.parallel_drafting",
    "check_next_token_values": "specdraft.ops.prepare_inputs",
    "check_rejection_sample_values": "specdraft.ops.sampling.rejection",
    "check_rejection_values": "specdraft.ops.prepare_inputs",
    "check_shift_and_cache_values": "specdraft.ops.shift_and_cache.window",
    "check_shift_plan_values": "specdraft.ops.shift_plan",
    "check_step_metadata_values": "specdraft.ops.step_metadata",
    "check_truncation_cut_values": "specdraft.ops.sampling.truncation.op",
}

# name -> the module defining it. These modules import hypothesis at the top, so all
# of them need the extra.
_NEEDS_HYPOTHESIS = {
    # shift-and-cache
    "ShiftLayout": "shift_and_cache",
    "shift_layouts": "shift_and_cache",
    # batch preparation (prepare_inputs, step_metadata)
    "RejectionLayout": "batch",
    "SampledLayout": "batch",
    "StepLayout": "batch",
    "rejection_layouts": "batch",
    "sampled_layouts": "batch",
    "step_layouts": "batch",
    # parallel drafting (copy_and_expand_inputs, new_slot_mapping)
    "ExpandLayout": "expand",
    "expand_layouts": "expand",
    # sampling (draft_sample, rejection_sample)
    "SamplingBatch": "sampling",
    "sampling_batches": "sampling",
    # invalid inputs, each tagged with the rule it breaks
    "OP_RULES": "invalid",
    "OpCase": "invalid",
    "invalid_op_cases": "invalid",
    "BATCH_RULES": "invalid_batches",
    "InvalidDraftBatch": "invalid_batches",
    "invalid_draft_batches": "invalid_batches",
}

EXTRA_HINT = 'pip install "hypothesis>=6.100" (or, in a clone, pip install ".[testing]")'


def __getattr__(name: str):
    if name in _VALUE_CHECKERS:
        value = getattr(importlib.import_module(_VALUE_CHECKERS[name]), name)
        globals()[name] = value
        return value
    module_name = _NEEDS_HYPOTHESIS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ModuleNotFoundError as error:
        if error.name != "hypothesis":
            raise
        raise ImportError(f"specdraft.testing.{name} needs hypothesis: {EXTRA_HINT}") from error
    value = getattr(module, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_VALUE_CHECKERS) | set(_NEEDS_HYPOTHESIS))


__all__ = [
    "CompileCounts",
    "DraftBatch",
    "fresh_compile",
    "make_draft_batch",
    *_VALUE_CHECKERS,
    *_NEEDS_HYPOTHESIS,
]
