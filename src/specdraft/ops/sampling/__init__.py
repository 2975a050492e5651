"""Sampling ops: draft-token sampling (draft/), rejection sampling of drafts
against the target (rejection/) and verification of a draft tree (tree_verify.py),
all drawing the counter-based noise of noise.py and streaming the vocabulary with
ops/common/scan.py's loop over tiles.py's tiles. Chain and tree verification share
their statistics and finish kernels (verify_kernels.py); the tree's walk is
tree_walk.py's. A request's top-k, top-p and min-p become one logit cut per row
(truncation/), which the three samplers take as `logit_cut`: a sampled row's tokens
below it get probability 0 wherever its distribution is used."""

from .draft import draft_sample, draft_sample_reference, draft_sample_store_reference
from .noise import STREAM_ACCEPT, STREAM_DRAFT, STREAM_SAMPLE, noise_bits_reference, noise_uniform
from .rejection import rejection_sample, rejection_sample_reference
from .tree_verify import AcceptedPath, check_tree_verify_values, tree_verify, tree_verify_reference
from .truncation import check_truncation_cut_values, truncation_cut, truncation_cut_reference

__all__ = [
    "AcceptedPath",
    "STREAM_ACCEPT",
    "STREAM_DRAFT",
    "STREAM_SAMPLE",
    "draft_sample",
    "draft_sample_reference",
    "draft_sample_store_reference",
    "noise_bits_reference",
    "noise_uniform",
    "rejection_sample",
    "rejection_sample_reference",
    "check_tree_verify_values",
    "tree_verify",
    "tree_verify_reference",
    "check_truncation_cut_values",
    "truncation_cut",
    "truncation_cut_reference",
]
