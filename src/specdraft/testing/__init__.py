"""Public helpers for testing code built on specdraft: Hypothesis strategies of valid
batch layouts, opt-in value checkers (these sync with the host: tests only), and
compile counters."""

try:
    import hypothesis  # noqa: F401
except ImportError as error:  # pragma: no cover
    raise ImportError("specdraft.testing needs hypothesis: pip install 'specdraft[testing]'") from error

from specdraft.testing.batch import (
    RejectionLayout,
    SampledLayout,
    StepLayout,
    check_rejection_values,
    check_step_metadata_values,
    rejection_layouts,
    sampled_layouts,
    step_layouts,
)
from specdraft.testing.compile import CompileCounts, fresh_compile
from specdraft.testing.expand import ExpandLayout, expand_layouts
from specdraft.testing.proposers import DraftBatch, make_draft_batch
from specdraft.testing.sampling import (
    SamplingBatch,
    check_draft_sample_values,
    check_rejection_sample_values,
    sampling_batches,
)
from specdraft.testing.shift_and_cache import (
    ShiftLayout,
    check_shift_and_cache_values,
    shift_layouts,
)

__all__ = [
    "CompileCounts",
    "ShiftLayout",
    "check_shift_and_cache_values",
    "fresh_compile",
    "shift_layouts",
    # batch preparation (prepare_inputs, step_metadata)
    "RejectionLayout",
    "SampledLayout",
    "StepLayout",
    "check_rejection_values",
    "check_step_metadata_values",
    "rejection_layouts",
    "sampled_layouts",
    "step_layouts",
    # parallel drafting (copy_and_expand_inputs, new_slot_mapping)
    "ExpandLayout",
    "expand_layouts",
    # proposers
    "DraftBatch",
    "make_draft_batch",
    # sampling (draft_sample, rejection_sample)
    "SamplingBatch",
    "check_draft_sample_values",
    "check_rejection_sample_values",
    "sampling_batches",
]
