"""Files shipped with the package: the demo's trained target / EAGLE-3 pair
(demo_pair/target, demo_pair/eagle3, demo_pair/training.json; made by
scripts/train_demo_pair.py), and the stdlib files held out of its training."""

import json
import sysconfig
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


def demo_files(split: str) -> list[Path]:
    """The standard-library files the demo pair was trained on (split "train_files")
    or not (split "held_out_files"), as training.json lists them, found in the
    running interpreter's stdlib; files this Python does not have are left out. The
    pair was trained on Python 3.12's."""
    record = json.loads((DEMO_PAIR / "training.json").read_text())
    root = Path(sysconfig.get_paths()["stdlib"])
    return [root / name for name in record[split] if (root / name).is_file()]


def demo_held_out_files() -> list[Path]:
    """The stdlib files held out of the demo pair's training (demo_files)."""
    return demo_files("held_out_files")
