"""Training-time draft evaluation: the K-step unroll of the serving heads, the block
drafters' training forward and losses, and the acceptance metrics, all compiled with
fullgraph and free of host syncs."""

from specdraft.training.block import (
    DFLASH_LOSS,
    DSPARK_LOSS,
    BlockLabels,
    BlockLoss,
    BlockLossWeights,
    BlockOutput,
    aligned_target_logits,
    anchor_candidates,
    block_forward,
    block_forward_for_eval,
    block_labels,
    block_loss,
    sample_anchors,
    start_anchors,
)
from specdraft.training.capture import capture_target_outputs
from specdraft.training.evaluate import DraftEvaluator, evaluate, specialized_floats
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
    # block drafters (DFlash, DSpark): the training forward, labels, losses
    "BlockOutput",
    "BlockLabels",
    "BlockLoss",
    "BlockLossWeights",
    "DFLASH_LOSS",
    "DSPARK_LOSS",
    "start_anchors",
    "anchor_candidates",
    "sample_anchors",
    "block_forward",
    "block_forward_for_eval",
    "block_labels",
    "aligned_target_logits",
    "block_loss",
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
    "specialized_floats",
    "format_table",
    "plot_acceptance",
    "plot_training_curve",
]
