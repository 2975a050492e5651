"""Proposers: the propose loop as free functions (loop.py) and its draft sampling
(draft_sampling.py), the holder every proposer shares (base.py), and one thin class
per proposer holding its head, config, KV caches and what differs. Every proposer
has the same `propose` signature, and `propose_padded` / `propose_unpadded` after
verification."""

from specdraft.proposers.autoregressive import AutoregressiveSpeculator, DraftLM, PrefillState
from specdraft.proposers.base import Proposer
from specdraft.proposers.block import BlockDraftOutput, BlockProposer
from specdraft.proposers.draft_sampling import DraftOutput, DraftSampler
from specdraft.proposers.eagle import EagleProposer
from specdraft.proposers.loop import StepState
from specdraft.proposers.multi_group import GroupedBatchMetadata, MultiGroupMTPProposer
from specdraft.proposers.multi_layer import MultiLayerEagleProposer
from specdraft.proposers.tree import TreeDraftOutput
from specdraft.proposers.tree_build import DraftTree, TreeShape

__all__ = [
    "AutoregressiveSpeculator",
    "BlockDraftOutput",
    "BlockProposer",
    "PrefillState",
    "DraftLM",
    "DraftOutput",
    "DraftSampler",
    "EagleProposer",
    "GroupedBatchMetadata",
    "MultiGroupMTPProposer",
    "MultiLayerEagleProposer",
    "Proposer",
    "StepState",
    "DraftTree",
    "TreeDraftOutput",
    "TreeShape",
]
