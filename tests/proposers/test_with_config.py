"""Proposer.with_config and with_num_drafts (proposers/base.py): a copy that shares
the head and the KV caches and changes only the named config fields, or the proposer
itself where nothing changes; with_num_drafts' range and the proposers that draft
exactly K."""

import copy
import dataclasses

import pytest

from specdraft.assets import load_demo_pair
from specdraft.config import SpeculativeConfig
from specdraft.proposers import EagleProposer


@pytest.fixture(scope="module")
def proposer():
    _, head = load_demo_pair()
    config = SpeculativeConfig(method="eagle3", num_speculative_tokens=3, max_model_len=64, block_size=16,
                               return_draft_confidence=True)  # fmt: skip
    return EagleProposer(head, config, head.allocate_kv_caches(8, 16))


def changed_fields(a, b) -> set[str]:
    return {f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)}


def test_a_change_is_a_sharing_copy(proposer):
    plain = proposer.with_config(return_draft_confidence=False)
    assert plain is not proposer and plain.model is proposer.model and plain.kv_caches is proposer.kv_caches
    assert changed_fields(plain.config, proposer.config) == {"return_draft_confidence"}
    assert proposer.config.return_draft_confidence  # the original is untouched
    assert proposer.with_config(return_draft_confidence=True) is proposer  # nothing changes: itself
    with pytest.raises(TypeError):
        proposer.with_config(no_such_field=1)


def test_num_drafts(proposer):
    one = proposer.with_num_drafts(1)
    assert one.num_speculative_tokens == 1 and one.model is proposer.model
    assert changed_fields(one.config, proposer.config) == {"num_speculative_tokens"}
    assert proposer.with_num_drafts(3) is proposer
    for k in (0, 4, True, 2.0):
        with pytest.raises(ValueError, match=r"k: an int in \[1, 3\]"):
            proposer.with_num_drafts(k)
    exact = copy.copy(proposer)
    exact.drafts_fewer = False  # as a proposer whose state is sized by K (the multi-layer one's rows)
    with pytest.raises(ValueError, match="k: EagleProposer drafts exactly its config's K = 3"):
        exact.with_num_drafts(1)
