"""Training-time evaluation of block drafters (DraftEvaluator, loop "block") and the
eval CLI on a block drafter's folder.

- The evaluator's sums equal a plain loop over every chain start t (the block
  anchored at t + 1) whose drafts and draft distributions come from the float64
  oracle of the serving path (tests/models/block_oracle.py), run on the anchor's
  context alone: scored pairs, greedy matches, Σ min(p, q) at a temperature, the
  accepted prefix per full start; the acceptance length as DeepSpec's evaluator
  counts it (accepted drafts + 1 per block) and its accept_rate@k.
- Compiled (fullgraph, dynamic shapes): one graph, no graph break, for batches of
  three lengths and sequence counts, equal to eager, nothing requiring grad; a
  compiled training step (block_forward + DeepSpec's DSpark loss, fullgraph) equals
  eager and its gradients, without a recompile at the next steps.
- save_block_drafter / load_block_drafter round-trip a head; `specdraft eval` on such a
  folder reports the evaluator's sums and DeepSpec's acceptance length, takes the
  block size as the default --steps, and refuses more, --method, and shards of
  other aux layers in one line.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from specdraft.assets import load_demo_pair
from specdraft.eval import main
from specdraft.models.block_loading import load_block_drafter
from specdraft.models.block_saving import save_block_drafter
from specdraft.testing import CompileCounts, fresh_compile
from specdraft.training import (
    DSPARK_LOSS,
    DraftEvaluator,
    aligned_target_logits,
    block_forward,
    block_labels,
    block_loss,
    capture_target_outputs,
    combine,
    finalize,
    sample_anchors,
    save_batch,
)
from tests.models.block_oracle import OracleDrafter

from fixtures.block_heads import VARIANTS, make_block_batch, make_block_head, sequence_bounds

BATCHES = [([9, 4, 12], False), ([7, 1, 10, 3], True)]  # (lengths, with a loss mask)


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def plain_loop(head, batches, num_steps, temperature):
    """Per step k: scored pairs, greedy matches, Σ min(p, q); per full start the
    accepted prefix; from the oracle's greedy block at anchor t + 1."""
    count, matches, accept, prefix = ([0.0] * num_steps for _ in range(4))
    starts, per_block = 0, []
    for batch, lengths in batches:
        ids, feats, scored_rows = batch.token_ids, batch.hidden_states, batch.loss_mask
        argmax = batch.target_logits.argmax(-1)
        for b0, b1 in sequence_bounds(lengths):
            for t in range(b0, b1 - 1):
                p = t + 1
                oracle = OracleDrafter(head)
                h = oracle.block_step(feats[b0:p], torch.arange(p - b0), int(ids[p]), p - b0)
                _, logits, drafts, _ = oracle.draft(h, int(ids[p]))
                ok = []
                for k in range(num_steps):
                    row = t + k + 1
                    if row >= b1 or (scored_rows is not None and not bool(scored_rows[row])):
                        continue
                    count[k] += 1
                    ok.append(int(drafts[k]) == int(argmax[row]))
                    matches[k] += ok[-1]
                    q = torch.softmax(logits[k] / temperature, -1)
                    target = torch.softmax(batch.target_logits[row].double() / temperature, -1)
                    accept[k] += torch.minimum(q, target).sum().item()
                if len(ok) == num_steps:  # a full start: all K pairs scored
                    starts += 1
                    accepted = 0
                    while accepted < num_steps and ok[accepted]:
                        accepted += 1
                    per_block.append(accepted + 1)  # DeepSpec: accepted drafts + the target's token
                    for k in range(num_steps):
                        prefix[k] += accepted > k
    return count, matches, accept, prefix, starts, per_block


@pytest.mark.parametrize("qk_norm,markov,confidence,with_markov", VARIANTS)
def test_sums_equal_a_plain_loop_over_anchors(qk_norm, markov, confidence, with_markov):
    head = make_block_head(qk_norm, markov, confidence, with_markov, block_size=4)
    # Target logits that often agree with the drafts, so accepted prefixes of every length occur.
    batches = []
    for seed, (lengths, masked) in enumerate(BATCHES):
        batch = make_block_batch(head, lengths, seed=seed, loss_mask=masked)
        with torch.no_grad():
            anchors = (torch.arange(sum(lengths)) + 1).clamp(max=sum(lengths) - 1)
            drafts = block_forward(head, batch.token_ids, batch.hidden_states, batch.positions, batch.cu_seqlens,
                                   anchors, tokens="draft").logits  # fmt: skip
        agree = torch.zeros_like(batch.target_logits)  # row t + k + 1 leans to block t's step k
        for k in range(4):
            agree[k + 1 :] += 4 * drafts[: drafts.shape[0] - k - 1, k]
        batches.append((batch._replace(target_logits=batch.target_logits + agree), lengths))
    evaluator = DraftEvaluator(head, num_steps=4, temperature=0.7, compile=False)
    sums = None
    for batch, _ in batches:
        part = evaluator(batch)
        sums = part if sums is None else combine(sums, part)
    count, matches, accept, prefix, starts, per_block = plain_loop(head, batches, 4, 0.7)
    assert sums.count.tolist() == count and sums.matches.tolist() == matches
    assert sums.accepted_prefix.tolist() == prefix and sums.starts.item() == starts
    torch.testing.assert_close(sums.accept, torch.tensor(accept, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    assert 0 < sum(matches) < sum(count)
    metrics = finalize(sums)
    deepspec = sum(per_block) / len(per_block)
    assert metrics.acceptance_length.item() + 1 == pytest.approx(deepspec, rel=1e-12)
    for k in range(4):  # DeepSpec's accept_rate@k: the share of blocks whose first k + 1 drafts are accepted
        share = sum(n > k + 1 for n in per_block) / len(per_block)
        assert metrics.accepted_prefix_rate[k].item() == pytest.approx(share, rel=1e-12)


def test_block_loop_checks():
    head = make_block_head(block_size=4)
    assert DraftEvaluator(head, num_steps=4, compile=False).loop == "block"
    with pytest.raises(ValueError, match="num_steps = 5 exceeds the head's block_size 4"):
        DraftEvaluator(head, num_steps=5, compile=False)
    with pytest.raises(ValueError, match="drafts whole blocks"):
        DraftEvaluator(head, num_steps=2, loop="eagle", compile=False)
    from fixtures.unroll_batches import head_for

    eagle3, _, _ = head_for("eagle3", False)
    with pytest.raises(ValueError, match="loop 'block' needs a block drafter"):
        DraftEvaluator(eagle3, num_steps=2, loop="block", compile=False)


def test_compiled_evaluation_one_graph_for_every_batch():
    head = make_block_head(True, "rnn", True, True)
    head.train()  # parameters require grad, as inside a training loop
    compiled = DraftEvaluator(head, num_steps=5, temperature=0.7, compile={"backend": "aot_eager"})
    eager = DraftEvaluator(head, num_steps=5, temperature=0.7, compile=False)
    torch._dynamo.reset()
    with CompileCounts.measure() as counts:
        for seed, lengths in enumerate(([9, 4, 12], [7, 1, 10, 3, 6], [17])):
            batch = make_block_batch(head, lengths, seed=seed, loss_mask=True)  # a mask or none: a guard
            got, want = compiled(batch), eager(batch)
            for name, a, b in zip(got._fields, got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)
                assert not a.requires_grad, name
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"{counts.compiles} graphs for three batch shapes"
    assert all(p.grad is None for p in head.parameters())


def dspark_loss(head, batch, anchors, keep):
    out = block_forward(head, batch.token_ids, batch.hidden_states, batch.positions, batch.cu_seqlens, anchors, keep)
    labels = block_labels(batch.token_ids, batch.cu_seqlens, anchors, keep, block_size=head.block_size,
                          loss_mask=batch.loss_mask)  # fmt: skip
    return block_loss(out.logits, labels, target_logits=aligned_target_logits(batch.target_logits, labels),
                      confidence=out.confidence, weights=DSPARK_LOSS).loss  # fmt: skip


def test_compiled_training_step_equals_eager_without_recompiles():
    head = make_block_head(True, "gated", True, True)
    head.train()
    batch = make_block_batch(head, [9, 4, 12], seed=7, target_scale=3.0, loss_mask=True)
    anchors, keep = sample_anchors(
        batch.cu_seqlens, 25, 12, batch.loss_mask, generator=torch.Generator().manual_seed(0)
    )
    eager_head = copy.deepcopy(head)
    want = dspark_loss(eager_head, batch, anchors, keep)
    want.backward()
    step = fresh_compile(dspark_loss, fullgraph=True, backend="aot_eager")
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    losses = []
    with CompileCounts.measure() as counts:
        for i in range(3):
            loss = step(head, batch, anchors, keep)
            loss.backward()
            if i == 0:
                torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
                for (name, p), q in zip(head.named_parameters(), eager_head.parameters(), strict=True):
                    torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
    assert counts.graph_breaks == 0 and counts.compiles == 1
    assert losses[-1] < losses[0]


# ------------------------------------------------------------------------ the CLI


@pytest.fixture(scope="module")
def demo_block(tmp_path_factory):
    """A random DSpark head shaped for the shipped target (its embedding and lm_head
    left out of the folder), and two shards of the target's aux layers 1, 2, 3."""
    root = tmp_path_factory.mktemp("block")
    target, _ = load_demo_pair()
    head = make_block_head(True, "vanilla", True, True, vocab=256, target_hidden=256, target_layer_ids=(0, 1, 2),
                           hidden=256, heads=4, head_dim=16, block_size=4)  # fmt: skip
    head.share_from(target)
    save_block_drafter(head, root / "head", shared=("embed_tokens", "lm_head"))
    gen = torch.Generator().manual_seed(5)
    (root / "data").mkdir()
    batches = []
    for i, lengths in enumerate(((30, 9), (21, 3))):
        seqs = [torch.randint(32, 127, (n,), generator=gen) for n in lengths]
        batch = capture_target_outputs(target, seqs, aux_layers=head.block.aux_layers)
        save_batch(root / "data" / f"shard-{i}.safetensors", batch, aux_layers=head.block.aux_layers)
        batches.append(batch)
    return root, head, batches


def test_block_folder_round_trip(demo_block, tmp_path):
    root, head, _ = demo_block
    loaded = load_block_drafter(root / "head")
    assert loaded.missing_weights == {"embed_tokens", "lm_head"} and loaded.block == head.block
    assert loaded.config == head.config
    loaded.share_from(load_demo_pair()[0])
    for (name, a), b in zip(head.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    save_block_drafter(loaded, tmp_path / "again")
    assert load_block_drafter(tmp_path / "again").missing_weights == frozenset()


def test_eval_cli_on_a_block_drafter(demo_block, tmp_path, capsys):
    root, head, batches = demo_block
    record = tmp_path / "m.json"
    argv = [str(root / "head"), str(root / "data"), "--target", "demo", "--eager", "--no-progress"]
    assert main([*argv, "--json", str(record)]) == 0
    out = capsys.readouterr().out
    evaluator = DraftEvaluator(head, num_steps=4, compile=False)  # the block size: the default --steps
    sums = combine(evaluator(batches[0]), evaluator(batches[1]))
    got = json.loads(record.read_text())
    for name, value in sums._asdict().items():
        assert got["sums"][name] == pytest.approx(value.tolist(), rel=1e-6, abs=1e-6), name
    deepspec = finalize(sums).acceptance_length.item() + 1
    assert got["deepspec_acceptance_length"] == pytest.approx(deepspec)
    assert f"acceptance length as DeepSpec counts it (accepted drafts + 1, per block): {deepspec:.4f}" in out
    assert "K = 4" in out and "block loop" in out

    def refused(extra, message):
        assert main([*argv, *extra]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines

    refused(["--steps", "5"], "--steps 5: a block drafter drafts at most its block_size = 4 tokens")
    refused(["--method", "eagle3"], "is a block drafter (DFlash / DSpark); drop --method")
    save_batch(tmp_path / "other.safetensors", batches[0], aux_layers=(0, 1, 2))
    assert main([str(root / "head"), str(tmp_path / "other.safetensors"), "--target", "demo", "--eager",
                 "--no-progress"]) == 2  # fmt: skip
    assert "holds the target's layers [0, 1, 2]; the head fuses [1, 2, 3]" in capsys.readouterr().err
