"""A block drafter's folder in specdraft's own layout: config.json (the backbone's
DraftModelConfig keys plus a "specdraft_block" entry with the BlockConfig) and
model.safetensors under the head's own parameter names (DeepSpec's). What the eval
CLI and the tests save and load; DeepSpec's released layouts are another reader's.

    save_block_head(head, "heads/dspark", shared=("embed_tokens", "lm_head"))
    head = load_block_head("heads/dspark")     # then head.share_from(target)
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from specdraft.models.config import DraftModelConfig
from specdraft.models.heads.block import BlockConfig, BlockDraftHead
from specdraft.models.loading import SHAREABLE, copy_state
from specdraft.models.safetensors_io import write_safetensors

BLOCK_KEY = "specdraft_block"


def is_block_folder(folder: str | Path) -> bool:
    """Whether folder/config.json is a block drafter's in this layout."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return False
    config = json.loads(path.read_text())
    return isinstance(config, dict) and BLOCK_KEY in config


def save_block_head(head: BlockDraftHead, folder: str | Path, shared=()) -> None:
    """Write config.json and model.safetensors, leaving out the weights the head
    never had and the modules named in `shared` ("embed_tokens", "lm_head": the
    target's, given back by share_from)."""
    if not isinstance(head, BlockDraftHead):
        raise ValueError(f"head must be a BlockDraftHead, got {type(head).__name__}")
    shared = set(shared)
    shareable = {name.split(".")[0] for name in SHAREABLE}
    if not shared <= shareable:
        raise ValueError(f"shared: only {sorted(shareable)} can be left out, got {sorted(shared)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    block = asdict(head.block)
    block["target_layer_ids"] = list(block["target_layer_ids"])
    config = {**head.config.to_hf_config(), BLOCK_KEY: block}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    leave_out = set(head.missing_weights) | shared
    state = {k: v for k, v in head.state_dict().items() if k.split(".")[0] not in leave_out}
    write_safetensors(folder / "model.safetensors", state)


def load_block_head(
    folder: str | Path, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> BlockDraftHead:
    """The head `save_block_head` wrote; embed_tokens / lm_head left out stay missing
    (head.missing_weights) until share_from(target)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not is_block_folder(folder):
        raise ValueError(f"{folder}: no config.json with a {BLOCK_KEY!r} entry (not a block drafter's folder)")
    hf = json.loads((folder / "config.json").read_text())
    block = dict(hf.pop(BLOCK_KEY))
    block["target_layer_ids"] = tuple(block["target_layer_ids"])
    head = BlockDraftHead(DraftModelConfig.from_hf_config(hf, dtype=dtype), BlockConfig(**block))
    tensors = load_file(str(folder / "model.safetensors"))
    left_out = copy_state(head, tensors, may_be_missing=lambda name: name in SHAREABLE)
    head.missing_weights = frozenset(name.split(".")[0] for name in left_out)
    return head.to(device) if device is not None else head
