"""opcheck for every sampling op; K draft steps (each sampling a token and storing
its probabilities at a device-scalar step) followed by rejection sampling,
compiled with fullgraph=True, equal eager (tokens identical, probs allclose) with
no graph break; with dynamic=True one compile serves three batch sizes."""

import torch

from specdraft.ops import draft_sample, rejection_sample
from specdraft.testing import CompileCounts, SamplingBatch, fresh_compile

NUM_SPEC = 3
VOCAB = 37  # distinct from every batch size and from K, K + 1 (duck sizing)


def batch_of(num_reqs: int, data_seed: int = 0) -> SamplingBatch:
    return SamplingBatch(
        vocab=VOCAB,
        num_spec=NUM_SPEC,
        temperature=[0.0 if b % 3 == 0 else 0.5 + 0.25 * (b % 4) for b in range(num_reqs)],
        seeds=[1000 + 17 * b for b in range(num_reqs)],
        positions=[3 * b for b in range(num_reqs)],
        num_draft=[(b * 5) % (NUM_SPEC + 1) for b in range(num_reqs)],
        data_seed=data_seed,
    )


def inputs(batch: SamplingBatch, device):
    t = batch.tensors(device)
    steps = [torch.tensor(j, device=device) for j in range(NUM_SPEC)]
    probs = torch.zeros(batch.num_reqs, NUM_SPEC, VOCAB, device=device)
    return t, steps, probs


def propose_and_verify(logits, temperature, seeds, positions, target_logits, num_draft_tokens, probs, steps):
    """K draft steps on logits perturbed per step, then verification."""
    drafts = []
    for j, step in enumerate(steps):
        step_logits = logits + 0.5 * j
        drafts.append(draft_sample(step_logits, temperature, seeds, positions + j, salt=1, probs_out=probs, step=step))
    draft_tokens = torch.stack(drafts, 1)
    tokens, counts = rejection_sample(
        draft_tokens, num_draft_tokens, probs, target_logits, temperature, seeds, positions, salt=2
    )
    return draft_tokens, tokens, counts


def call(fn, t, steps, probs):
    return fn(
        t["logits"], t["temperature"], t["seeds"], t["positions"], t["target_logits"], t["num_draft_tokens"],
        probs, steps,
    )  # fmt: skip


def assert_same(eager, eager_probs, compiled, compiled_probs):
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a, b)
    torch.testing.assert_close(compiled_probs, eager_probs, rtol=1e-5, atol=1e-7)


def test_opcheck_every_op(device):
    t, steps, probs = inputs(batch_of(6), device)
    req = (t["temperature"], t["seeds"], t["positions"])
    torch.library.opcheck(torch.ops.specdraft.draft_sample, (t["logits"], *req, 0))
    for write_probs in (True, False):
        torch.library.opcheck(
            torch.ops.specdraft.draft_sample_store, (t["logits"], *req, probs.clone(), steps[1], 3, write_probs)
        )
    torch.library.opcheck(torch.ops.specdraft.noise_bits, (t["seeds"], t["positions"], VOCAB, 5, 2))
    for draft_probs in (t["draft_probs"], None):
        torch.library.opcheck(
            torch.ops.specdraft.rejection_sample,
            (t["draft_tokens"], t["num_draft_tokens"], draft_probs, t["target_logits"], *req, 4),
        )


def test_fullgraph_equals_eager_without_graph_breaks(device):
    t, steps, probs = inputs(batch_of(6), device)
    eager_probs, compiled_probs = probs.clone(), probs.clone()
    eager = call(propose_and_verify, t, steps, eager_probs)
    compiled = fresh_compile(propose_and_verify, fullgraph=True)
    with CompileCounts.measure() as counts:
        got = call(compiled, t, steps, compiled_probs)
    assert_same(eager, eager_probs, got, compiled_probs)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1


def test_dynamic_shapes_compile_once_across_batch_sizes(device):
    compiled = fresh_compile(propose_and_verify, fullgraph=True, dynamic=True)
    with CompileCounts.measure() as counts:
        for num_reqs in (5, 9, 17):
            t, steps, probs = inputs(batch_of(num_reqs, data_seed=num_reqs), device)
            eager_probs, compiled_probs = probs.clone(), probs.clone()
            eager = call(propose_and_verify, t, steps, eager_probs)
            got = call(compiled, t, steps, compiled_probs)
            assert_same(eager, eager_probs, got, compiled_probs)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"recompiled: {counts.compiles} graphs for 3 batch sizes"
