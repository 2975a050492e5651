"""Training-time draft evaluation: the K-step unroll of the serving heads and the
acceptance metrics, both compiled with fullgraph and free of host syncs."""

from specdraft.training.capture import capture_target_outputs
from specdraft.training.evaluate import DraftEvaluator, evaluate
from specdraft.training.metrics import (
    DraftMetrics,
    DraftMetricSums,
    combine,
    draft_metrics,
    finalize,
    reduce,
    zero_sums,
)
from specdraft.training.report import format_table, plot_acceptance, plot_training_curve
from specdraft.training.shards import (
    TargetBatch,
    load_batch,
    save_batch,
    shard_metadata,
    shard_paths,
    split_batch,
)
from specdraft.training.unroll import UnrollOutput, unroll, unroll_for_eval

__all__ = [
    # the unroll
    "UnrollOutput",
    "unroll",
    "unroll_for_eval",
    # the metrics
    "DraftMetricSums",
    "DraftMetrics",
    "combine",
    "draft_metrics",
    "finalize",
    "reduce",
    "zero_sums",
    # saved target outputs, offline evaluation and its report
    "TargetBatch",
    "capture_target_outputs",
    "save_batch",
    "load_batch",
    "shard_metadata",
    "shard_paths",
    "split_batch",
    "DraftEvaluator",
    "evaluate",
    "format_table",
    "plot_acceptance",
    "plot_training_curve",
]
