"""Files shipped with the package: the demo's trained target and its three drafters
(demo_pair/target and demo_pair/eagle3, made by scripts/train_demo_pair.py;
demo_pair/dflash and demo_pair/dspark, block drafters made by
scripts/train_block_drafters.py; demo_pair/training.json records both runs), and the
stdlib files held out of their training."""

import json
import sysconfig
from pathlib import Path

import torch

from specdraft.models import BlockDraftHead, Eagle3Head, TinyTargetModel, load_block_drafter, load_draft_model
from specdraft.models.target_loading import load_target_model

DEMO_PAIR = Path(__file__).resolve().parent / "demo_pair"
DEMO_DRAFTERS = ("eagle3", "dflash", "dspark")


def load_demo_pair(
    dtype: torch.dtype | None = None, device: torch.device | str | None = None, drafter: str = "eagle3"
) -> tuple[TinyTargetModel, Eagle3Head | BlockDraftHead]:
    """(target, head) in eval mode: the shipped target (load_target_model) and the
    shipped drafter named `drafter` (load_demo_drafter), sharing its weights. The
    EAGLE-3 head fuses the target layers default_aux_layers(4) names; the block
    drafters read the layers their config names (head.block.aux_layers)."""
    target = load_target_model(DEMO_PAIR / "target", dtype=dtype, device=device).eval()
    return target, load_demo_drafter(drafter, target, dtype=dtype, device=device)


def load_demo_drafter(
    drafter: str, target: TinyTargetModel, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Eagle3Head | BlockDraftHead:
    """A shipped drafter of the demo target, in eval mode, sharing `target`'s weights
    it was trained on and ships without:

    - "eagle3": the EAGLE-3 head (load_draft_model), sharing the target's embedding
      (its lm_head is its own);
    - "dflash", "dspark": the block drafters (load_block_drafter, DeepSpec's layout),
      sharing the target's embedding and lm_head (frozen in their training)."""
    if drafter not in DEMO_DRAFTERS:
        raise ValueError(f"drafter must be one of {DEMO_DRAFTERS}, got {drafter!r}")
    if drafter == "eagle3":
        head = load_draft_model(DEMO_PAIR / "eagle3", method="eagle3", dtype=dtype, device=device)
    else:
        head = load_block_drafter(DEMO_PAIR / drafter, dtype=dtype, device=device)
    head.share_from(target)
    return head.eval()


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
