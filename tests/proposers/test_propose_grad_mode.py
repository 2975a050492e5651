"""A compiled propose called between training steps, with autograd on (the trap a
training loop walks into: no `torch.no_grad()` around the call). Propose decides
itself that nothing it does is differentiable: its outputs and the KV caches it
writes never require grad, and an optimizer step on the head's parameters between
calls does not recompile it.

The oracle is autograd's own state (requires_grad, grad_fn) and Dynamo's counters;
the drafts are compared with an eager call under no_grad."""

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.proposers import EagleProposer, MultiLayerEagleProposer
from specdraft.testing import CompileCounts, fresh_compile
from specdraft.testing.proposers import make_draft_batch

from fixtures.draft_heads import VOCAB, make_head
from fixtures.multi_proposers import (
    ML_BLOCK,
    ML_BLOCKS_PER_REQ,
    ML_LAYERS,
    QUERY_LENS,
    TEMPERATURES,
    mtp_head,
)

BLOCK_SIZE = 4


def build(method: str, device):
    """(head in train mode, a batch, a maker of fresh proposers over that head)."""
    if method == "multi_layer":
        head = mtp_head(False, ML_LAYERS).to(device).train()
        batch = make_draft_batch(
            QUERY_LENS, vocab_size=VOCAB, target_hidden_size=head.config.target_hidden_size,
            block_size=ML_BLOCK, blocks_per_request=ML_BLOCKS_PER_REQ, temperatures=TEMPERATURES, device=device,
        )  # fmt: skip
        config = SpeculativeConfig(
            method="mtp", num_speculative_tokens=3, max_model_len=256, block_size=ML_BLOCK,
            draft_sampling="probabilistic", return_probs="probs",
        )  # fmt: skip
        num_blocks = len(QUERY_LENS) * ML_BLOCKS_PER_REQ

        def make():
            kv = head.allocate_kv_caches(num_blocks, ML_BLOCK, device=device)
            return MultiLayerEagleProposer(head, config, kv, max_num_reqs=len(QUERY_LENS))

        return head, batch, make
    head, target_hidden = make_head(method)
    head = head.to(device).train()  # a head being trained: parameters require grad
    config = SpeculativeConfig(
        method=method, num_speculative_tokens=3, max_model_len=256, block_size=BLOCK_SIZE,
        draft_sampling="probabilistic", return_probs="probs",
    )  # fmt: skip
    batch = make_draft_batch(
        [5, 2, 7], vocab_size=VOCAB, target_hidden_size=target_hidden, block_size=BLOCK_SIZE, blocks_per_request=8,
        temperatures=[0.0, 0.7, 1.0], device=device,
    )  # fmt: skip
    return head, batch, lambda: EagleProposer(head, config, head.allocate_kv_caches(24, BLOCK_SIZE, device=device))


def optimizer_step(head: torch.nn.Module) -> None:
    """One SGD step on a loss of every parameter, as a training loop does."""
    optimizer = torch.optim.SGD(head.parameters(), lr=1e-3)
    loss = sum((p.float() ** 2).sum() for p in head.parameters())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("method", ["eagle3", "mtp", "multi_layer"])
def test_compiled_propose_with_grad_enabled_records_nothing(device, method):
    head, batch, make_proposer = build(method, device)
    assert all(p.requires_grad for p in head.parameters())
    compiled, eager = make_proposer(), make_proposer()
    fn = fresh_compile(compiled.propose, fullgraph=True, backend="aot_eager")
    assert torch.is_grad_enabled()
    with CompileCounts.measure() as counts:
        for _ in range(3):
            got = fn(*batch.propose_args())
            assert not got.draft_probs.requires_grad and got.draft_probs.grad_fn is None
            assert not any(cache.requires_grad for cache in compiled.kv_caches)
            with torch.no_grad():
                want = eager.propose(*batch.propose_args())
            assert torch.equal(got.draft_tokens, want.draft_tokens)
            optimizer_step(head)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"{counts.compiles} graphs for 3 calls between optimizer steps"


def test_eager_padded_and_unpadded_paths_record_nothing(device):
    head, batch, make_proposer = build("eagle3", device)
    proposer = make_proposer()
    hidden = batch.target_hidden_states.clone().requires_grad_(True)  # e.g. a target being fine-tuned
    args = (batch.target_token_ids, batch.target_positions, hidden)
    num_reqs = batch.metadata.num_reqs
    sampled = torch.full((num_reqs, 4), -1, dtype=torch.int64, device=device)
    sampled[:, 0] = 3
    padded = proposer.propose_padded(
        *args, sampled, torch.arange(1, num_reqs + 1, device=device) * 3, batch.next_token_ids, batch.metadata,
        batch.sampling,
    )  # fmt: skip
    rejected = torch.zeros(num_reqs, dtype=torch.int32, device=device)
    unpadded = proposer.propose_unpadded(
        *args, batch.next_token_ids, rejected, batch.metadata, num_kept_tokens=batch.target_token_ids.shape[0],
        sampling=batch.sampling,
    )  # fmt: skip
    for out in (padded, unpadded):
        assert out.draft_probs.grad_fn is None
    assert not any(cache.requires_grad for cache in proposer.kv_caches)
