"""Files shipped with the package: the demo's trained target / EAGLE-3 pair
(demo_pair/target, demo_pair/eagle3, demo_pair/training.json; made by
scripts/train_demo_pair.py)."""

from pathlib import Path

import torch

from specdraft.models import Eagle3Head, TinyTargetModel, load_draft_model
from specdraft.models.target_loading import load_target_model

DEMO_PAIR = Path(__file__).resolve().parent / "demo_pair"


def load_demo_pair(
    dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> tuple[TinyTargetModel, Eagle3Head]:
    """(target, head) in eval mode, loaded with load_target_model / load_draft_model;
    the head shares the target's embedding (it was trained on it and ships without
    one). The head fuses the target layers default_aux_layers(4) names."""
    target = load_target_model(DEMO_PAIR / "target", dtype=dtype, device=device).eval()
    head = load_draft_model(DEMO_PAIR / "eagle3", method="eagle3", dtype=dtype, device=device).eval()
    head.share_from(target)
    return target, head
