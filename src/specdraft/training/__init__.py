"""Training-time draft evaluation: the acceptance metrics of a draft head's per-step
logits against the target's, as float64 sums with no host syncs (they compile with
fullgraph and reduce in one collective)."""

from specdraft.training.metrics import DraftMetrics, DraftMetricSums, combine, draft_metrics, finalize, reduce

__all__ = ["DraftMetricSums", "DraftMetrics", "combine", "draft_metrics", "finalize", "reduce"]
