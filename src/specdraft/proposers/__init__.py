"""Proposers: one shared propose loop (base.Proposer) and subclasses that change
only what differs."""

from specdraft.proposers.autoregressive import AutoregressiveSpeculator, DecodeState, DraftLM
from specdraft.proposers.base import DraftOutput, Proposer
from specdraft.proposers.eagle import EagleProposer
from specdraft.proposers.multi_group import GroupedBatchMetadata, MultiGroupMTPProposer
from specdraft.proposers.multi_layer import MultiLayerEagleProposer

__all__ = [
    "AutoregressiveSpeculator",
    "DecodeState",
    "DraftLM",
    "DraftOutput",
    "EagleProposer",
    "GroupedBatchMetadata",
    "MultiGroupMTPProposer",
    "MultiLayerEagleProposer",
    "Proposer",
]
