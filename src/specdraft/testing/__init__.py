"""Public helpers for testing code built on specdraft.

Without any extra: the compile counters (`CompileCounts`, `fresh_compile`) and
`make_draft_batch` (complete `propose()` inputs). With `pip install
'specdraft[testing]'` (hypothesis): the strategies of valid batch layouts, the
layout types and the opt-in value checkers (these sync with the host: tests only).

The hypothesis-backed names are loaded on first use (module `__getattr__`), so
`import specdraft.testing` never imports hypothesis; using one of them without it
raises an ImportError that names the extra.
"""

import importlib

from specdraft.testing.compile import CompileCounts, fresh_compile
from specdraft.testing.proposers import DraftBatch, make_draft_batch

# name -> the module defining it. These modules import hypothesis at the top (the
# value checkers share a module with their strategies), so all of them need the extra.
_NEEDS_HYPOTHESIS = {
    # shift-and-cache
    "ShiftLayout": "shift_and_cache",
    "check_shift_and_cache_values": "shift_and_cache",
    "shift_layouts": "shift_and_cache",
    # batch preparation (prepare_inputs, step_metadata)
    "RejectionLayout": "batch",
    "SampledLayout": "batch",
    "StepLayout": "batch",
    "check_rejection_values": "batch",
    "check_step_metadata_values": "batch",
    "rejection_layouts": "batch",
    "sampled_layouts": "batch",
    "step_layouts": "batch",
    # parallel drafting (copy_and_expand_inputs, new_slot_mapping)
    "ExpandLayout": "expand",
    "expand_layouts": "expand",
    # sampling (draft_sample, rejection_sample)
    "SamplingBatch": "sampling",
    "check_draft_sample_values": "sampling",
    "check_rejection_sample_values": "sampling",
    "sampling_batches": "sampling",
}

EXTRA_HINT = "pip install 'specdraft[testing]'"


def __getattr__(name: str):
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
    return sorted(set(globals()) | set(_NEEDS_HYPOTHESIS))


__all__ = ["CompileCounts", "DraftBatch", "fresh_compile", "make_draft_batch", *_NEEDS_HYPOTHESIS]
