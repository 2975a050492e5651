"""The unroll compiled, in a training loop.

- A small training loop (unroll + loss, compiled with fullgraph=True; backward and
  an optimizer step) runs with 0 graph breaks; at the first step the compiled loss
  and every parameter's gradient equal eager's (the oracle: the same function
  uncompiled).
- The trap the issue measured: an evaluation called between optimizer steps with
  autograd on. `unroll_for_eval`, compiled once (dynamic=True), runs between the
  steps without a recompile, returns nothing that requires grad, and leaves no
  autograd state on the head (no buffer requires grad, no .grad appears); its
  drafts equal eager's at the final weights; a batch of other sizes (T, S) reuses
  the same graph.
"""

import copy
import os

import pytest
import torch

from specdraft.testing import CompileCounts, fresh_compile
from specdraft.training import unroll, unroll_for_eval

from fixtures.unroll_batches import head_for, make_packed

# Sizes unlike every other dimension (hidden 32, vocab 64, draft vocab 40, aux 72),
# so dynamic shapes never tie them at the first compile.
LENGTHS, OTHER_LENGTHS = [5, 2, 6], [7, 3, 5, 4]  # T = 13, 4 bounds; T = 19, 5 bounds
STEPS = 3  # = the multi-layer head's layers


def loss_fn(head, batch, targets, *, tokens, loop):
    """Soft cross-entropy against fixed target distributions over the draft
    vocabulary, on the steps whose target row exists."""
    out = unroll(head, *batch.unroll_args(), num_steps=STEPS, tokens=tokens, loop=loop)
    per_token = -(targets * torch.log_softmax(out.logits.float(), dim=-1)).sum(-1)
    return (per_token * out.valid).sum() / out.valid.sum().clamp(min=1)


SLOW_LANE = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("SPECDRAFT_SLOW") != "1", reason="slow lane: set SPECDRAFT_SLOW=1"),
]


# CI compiles one (about 100 s on 2 cores); the multi-layer loop in the slow lane.
@pytest.mark.parametrize(
    ("kind", "tokens"), [("eagle3", "data"), pytest.param("multi_layer", "draft", marks=SLOW_LANE)]
)
def test_compiled_training_loop_with_evals_between_steps(kind, tokens, device):
    head, target_hidden, loop = head_for(kind, False, device)
    head.train()
    batch = make_packed(LENGTHS, target_hidden=target_hidden, mrope=False, seed=3, device=device)
    other = make_packed(OTHER_LENGTHS, target_hidden=target_hidden, mrope=False, seed=4, device=device)
    vocab = head.lm_head.weight.shape[0]
    gen = torch.Generator().manual_seed(5)
    targets = torch.softmax(torch.randn(STEPS, sum(LENGTHS), vocab, generator=gen), -1).to(device)

    eager_head = copy.deepcopy(head)
    want = loss_fn(eager_head, batch, targets, tokens=tokens, loop=loop)
    want.backward()

    train = fresh_compile(lambda: loss_fn(head, batch, targets, tokens=tokens, loop=loop), fullgraph=True)
    evaluate = torch.compile(
        lambda b: unroll_for_eval(head, *b.unroll_args(), num_steps=STEPS, loop=loop), fullgraph=True, dynamic=True
    )
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)

    def training_step(step):
        loss = train()
        loss.backward()
        if step == 0:
            torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
            for (name, p), q in zip(head.named_parameters(), eager_head.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        evaluated = evaluate(batch)  # autograd on, as in a training loop
        assert not any(t.requires_grad for t in evaluated if t is not None)
        assert all(p.grad is None for p in head.parameters())
        return loss

    with CompileCounts.measure() as first:
        training_step(0)
    with CompileCounts.measure() as later:
        losses = [training_step(step) for step in (1, 2)]
        evaluate(other)  # other T and S: the dynamic graph serves it
    assert first.graph_breaks == 0 and later.graph_breaks == 0
    assert first.compiles == 2  # one training graph, one evaluation graph
    assert later.compiles == 0, "the steps after the first recompiled"
    assert not any(b.requires_grad for b in head.buffers())
    assert losses[-1].item() < want.item()  # the loop trains

    for b in (batch, other):
        got = evaluate(b)
        expected = unroll_for_eval(head, *b.unroll_args(), num_steps=STEPS, loop=loop)
        assert torch.equal(got.draft_tokens, expected.draft_tokens)
        torch.testing.assert_close(got.logits, expected.logits, rtol=1e-4, atol=1e-5)
