"""Offline evaluation (specdraft.training.evaluate).

- The compiled step (unroll + metrics, fullgraph, dynamic) equals the eager step on
  batches of three lengths, with one graph and no graph break, and leaves no
  autograd state with grad mode on.
- Sums are exact across batches: evaluating shards one by one, or split into groups
  of whole sequences, gives the sums of evaluating their union at once.
- With a request's top-k / top-p / min-p, Σ min(p~, q~) per step is a plain loop's
  over the unroll's logits (specs.truncation's sort-based cut of each draft and
  target row, then Σ min), eager and compiled.
- The evaluator picks the head's proposer loop and refuses bad arguments by name.
"""

import pytest
import torch

from specdraft.assets import load_demo_pair
from specdraft.models import default_aux_layers
from specdraft.testing import CompileCounts
from specdraft.training import (
    DraftEvaluator,
    TargetBatch,
    capture_target_outputs,
    draft_metrics,
    evaluate,
    save_batch,
    unroll_for_eval,
)

import specs.vocab_metrics as spec
from fixtures.unroll_batches import head_for, make_packed

COUNTS = ("count", "matches", "accepted_prefix", "starts")  # integer-valued sums: exact in any order


def batch_for(head, lengths, width, seed, device):
    packed = make_packed(lengths, target_hidden=width, mrope=False, seed=seed, device=device)
    gen = torch.Generator().manual_seed(seed + 100)
    logits = torch.randn(sum(lengths), head.config.vocab_size, generator=gen).to(device)
    return TargetBatch(packed.token_ids, packed.hidden_states, logits, packed.positions, packed.cu_seqlens)


def test_compiled_step_equals_eager_with_one_graph(device):
    head, width, _ = head_for("eagle3", False, device)
    head.train()  # parameters require grad, as inside a training loop
    compiled = DraftEvaluator(head, num_steps=3, temperature=0.7, compile={"backend": "aot_eager"})
    eager = DraftEvaluator(head, num_steps=3, temperature=0.7, compile=False)
    torch._dynamo.reset()
    with CompileCounts.measure() as counts:
        for seed, lengths in enumerate(([5, 2, 6], [9, 3, 4, 7], [11])):
            batch = batch_for(head, lengths, width, seed, device)
            got, want = compiled(batch), eager(batch)
            for name, a, b in zip(got._fields, got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)
                assert not a.requires_grad, name
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"{counts.compiles} graphs for three batch lengths"
    # One trace: the temperature and the modules' floats (eps, RoPE theta) constant from
    # the start, not traced as symbols and the analysis restarted (evaluate.specialized_floats).
    assert counts.restarts == 0


@pytest.fixture(scope="module")
def demo_batches():
    """The shipped pair's head, and the target's outputs over four random byte strings."""
    target, head = load_demo_pair()
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(32, 127, (n,), generator=gen) for n in (40, 7, 26, 31)]
    aux = default_aux_layers(target.config.num_layers)
    whole = capture_target_outputs(target, seqs, aux_layers=aux)
    parts = [
        capture_target_outputs(target, seqs[:2], aux_layers=aux),
        capture_target_outputs(target, seqs[2:], aux_layers=aux),
    ]
    return head, whole, parts


def assert_same_sums(got, want):
    """Counts exactly; Σ min(p, q) to float32 rounding (the head's logits of a row
    may differ in the last bits with the batch around it: matmul blocking)."""
    for name, a, b in zip(got._fields, got, want, strict=True):
        if name in COUNTS:
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def test_sums_are_exact_across_shards_and_groups(demo_batches, tmp_path):
    head, whole, parts = demo_batches
    evaluator = DraftEvaluator(head, num_steps=3, temperature=1.0, compile=False)
    with torch.no_grad():
        out = unroll_for_eval(head, *whole.unroll_args(), num_steps=3)
        want = draft_metrics(out.logits, whole.target_logits, None, 1.0, cu_seqlens=whole.cu_seqlens)
    for i, part in enumerate(parts):
        save_batch(tmp_path / f"shard-{i}.safetensors", part)
    from_files, timing = evaluate(evaluator, sorted(tmp_path.glob("*.safetensors")), progress=False)
    assert_same_sums(from_files, want)
    assert timing["tokens"] == whole.num_tokens
    grouped, _ = evaluate(evaluator, [whole], max_batch_tokens=35, progress=False)  # groups [40], [7, 26], [31]
    assert_same_sums(grouped, want)
    assert int(want.starts) == sum(n - 3 for n in (40, 7, 26, 31))  # full starts: all 3 target rows inside


def test_loop_choice_and_bad_arguments():
    eagle3, _, _ = head_for("eagle3", False)
    multi, _, _ = head_for("multi_layer", False)
    assert eagle3.draft_loop == "eagle" and multi.draft_loop == "multi_layer"
    assert DraftEvaluator(multi, num_steps=2, compile=False).loop == "multi_layer"
    for kwargs, message in [
        (dict(num_steps=0), "num_steps"),
        (dict(temperature=float("nan")), "temperature must be a number"),
        (dict(temperature="0.5"), "temperature must be a number"),
        (dict(loop="tree"), "loop must be one of"),
        (dict(tokens="sampled"), "tokens must be one of"),
        (dict(compile="yes"), "compile must be a bool or a dict"),
        (dict(top_k=0.5), "top_k must be an int"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(min_p=-0.1), r"min_p must be in \[0, 1\]"),
        (dict(min_p=float("nan")), r"min_p must be in \[0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            DraftEvaluator(eagle3, **{"num_steps": 2, "compile": False, **kwargs})
    with pytest.raises(ValueError, match="batches: nothing to evaluate"):
        evaluate(DraftEvaluator(eagle3, num_steps=2, compile=False), [], progress=False)


def test_hidden_states_of_the_wrong_width_are_named():
    head, width, _ = head_for("eagle3", False)
    batch = batch_for(head, [4, 3], width, 0, "cpu")
    narrow = batch._replace(hidden_states=batch.hidden_states[:, : width // 3])
    with pytest.raises(ValueError, match=rf"hidden_states must have shape \(7, {width}\)"):
        DraftEvaluator(head, num_steps=2, compile=False)(narrow)


def test_truncated_acceptance_is_the_plain_loops(demo_batches):
    """The shipped pair at T = 0.7 with top-k 20 and top-p 0.9 (and min-p 0.05 beside
    them), eager and compiled: the counts and matches are the untruncated ones, and
    Σ min(p~, q~) per step is the plain loop's over the eager unroll's logits."""
    head, whole, _ = demo_batches
    truncation = {"top_k": 20, "top_p": 0.9, "min_p": 0.05}
    with torch.no_grad():
        logits = unroll_for_eval(head, *whole.unroll_args(), num_steps=3).logits
        untruncated = draft_metrics(logits, whole.target_logits, None, 0.7, cu_seqlens=whole.cu_seqlens)
    seq_lens = whole.cu_seqlens.diff().tolist()
    margins = []
    want = spec.draft_metric_sums([[row.tolist() for row in logits[k].double()] for k in range(3)],
                                  [row.tolist() for row in whole.target_logits.double()], [True] * whole.num_tokens,
                                  [0.7] * whole.num_tokens, seq_lens, None, False,
                                  [tuple(truncation.values())] * whole.num_tokens, margins)  # fmt: skip
    assert min(margins) > 1e-4, min(margins)  # no top-p decision within float rounding of its boundary
    for compile in (False, {"backend": "aot_eager"}):
        torch._dynamo.reset()
        evaluator = DraftEvaluator(head, num_steps=3, temperature=0.7, **truncation, compile=compile)
        with CompileCounts.measure() as counts:
            got = evaluator(whole)
        assert counts.graph_breaks == 0
        for name in COUNTS:
            assert torch.equal(getattr(got, name), getattr(untruncated, name)), name
        torch.testing.assert_close(got.accept, torch.tensor(want["accept"], dtype=torch.float64), rtol=1e-5, atol=1e-4)
        assert (got.accept - untruncated.accept).abs().max() > 1.0  # the truncation changed the sums
