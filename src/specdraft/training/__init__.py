"""Training-time draft evaluation: the K-step unroll of the serving heads and the
acceptance metrics, both compiled with fullgraph and free of host syncs."""

from specdraft.training.metrics import DraftMetrics, DraftMetricSums, combine, draft_metrics, finalize, reduce
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
]
