"""Proposers: one shared propose loop (base.Proposer) and subclasses that change
only what differs."""

from specdraft.proposers.base import DraftOutput, Proposer
from specdraft.proposers.eagle import EagleProposer

__all__ = ["DraftOutput", "EagleProposer", "Proposer"]
