"""A block drafter's training forward (specdraft.training.block), its attention and
DeepSpec's labels and losses, each against an independent oracle:

- the blocks of every anchor of a packed batch equal the float64 oracle of the
  serving path (tests/models/block_oracle.py, itself checked against BlockProposer
  and DeepSpec) run one anchor at a time on the anchor's context: logits (DSpark:
  Markov-corrected), greedy drafts and confidence logits, with the Markov head fed
  the block's own drafts ("draft") or the data ("data", DeepSpec's teacher forcing);
- the attention rule equals DeepSpec's create_dspark_attention_mask's mask_mod,
  written as a plain loop over its padded [B, L] layout, for the dense mask and the
  flex mask_mod; the flex block mask keeps every block holding a visible pair and
  marks full only blocks that are; flex (eager, and compiled by Inductor on the CPU
  with static shapes) equals dense;
- labels and eval_mask, the losses (CE with the positional decay, L1, the
  confidence BCE) equal plain loops of DeepSpec's formulas; sampled anchors follow
  DeepSpec's rule; a few SGD steps on the DSpark loss lower it, with a gradient at
  every trainable parameter.
"""

from __future__ import annotations

import math

import pytest
import torch

from specdraft.training import (
    DFLASH_LOSS,
    DSPARK_LOSS,
    BlockLossWeights,
    aligned_target_logits,
    anchor_candidates,
    block_forward,
    block_labels,
    block_loss,
    sample_anchors,
    start_anchors,
)
from specdraft.training.block_attention import (
    BLOCK,
    FlexLayout,
    anchor_block_mask,
    anchor_mask_mod,
    block_attention,
    context_visible,
)
from tests.models.block_oracle import OracleDrafter

from fixtures.block_heads import VARIANTS, make_block_batch, make_block_head, sequence_bounds

LENGTHS = [9, 4, 12]


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)  # tiny matmuls; conftest restores the count


def oracle_blocks(head, batch, lengths, tokens: str):
    """Per anchor row p (every row): (logits [S, V], drafts [S], confidence [S] or
    None) of the oracle, run on p's context alone."""
    out = {}
    ids, feats = batch.token_ids, batch.hidden_states
    w2 = None if head.markov_head is None else head.markov_head.markov_w2.weight.detach().double()
    w1 = None if head.markov_head is None else head.markov_head.markov_w1.weight.detach().double()
    for b0, b1 in sequence_bounds(lengths):
        for p in range(b0, b1):
            oracle = OracleDrafter(head)
            h = oracle.block_step(feats[b0:p], torch.arange(p - b0), int(ids[p]), p - b0)
            if tokens == "draft":
                _, logits, drafts, conf = oracle.draft(h, int(ids[p]))
                out[p] = (logits, drafts, conf)
                continue
            base = oracle.lin("lm_head", h)
            state = torch.zeros(head.block.markov_rank, dtype=torch.float64)
            rows, confs = [], []
            for s in range(head.block_size):
                prev = int(ids[min(p + s, b1 - 1)])  # teacher forcing: the data token before row s's label
                row = base[s]
                if w2 is not None:
                    latent, state = oracle.markov_latent(prev, h[s], state)
                    row = row + latent @ w2.T
                if head.confidence_head is not None:
                    feat = torch.cat([h[s], w1[prev]]) if head.block.confidence_with_markov else h[s]
                    confs.append(oracle.lin("confidence_head.proj", feat, bias=True)[0])
                rows.append(row)
            logits = torch.stack(rows)
            out[p] = (logits, logits.argmax(-1), torch.stack(confs) if confs else None)
    return out


@pytest.mark.parametrize("tokens", ["data", "draft"])
@pytest.mark.parametrize("qk_norm,markov,confidence,with_markov", VARIANTS)
def test_blocks_equal_the_serving_oracle_at_every_anchor(qk_norm, markov, confidence, with_markov, tokens):
    head = make_block_head(qk_norm, markov, confidence, with_markov)
    batch = make_block_batch(head, LENGTHS, seed=1)
    anchors = torch.arange(sum(LENGTHS))
    with torch.no_grad():
        out = block_forward(head, batch.token_ids, batch.hidden_states, batch.positions, batch.cu_seqlens, anchors,
                            tokens=tokens, attention="dense")  # fmt: skip
    want = oracle_blocks(head, batch, LENGTHS, tokens)
    assert bool(out.anchor_valid.all())
    for p, (logits, drafts, conf) in want.items():
        torch.testing.assert_close(out.logits[p].double(), logits, rtol=1e-5, atol=1e-5, msg=f"anchor {p}")
        assert out.draft_tokens[p].tolist() == drafts.tolist(), p
        if conf is None:
            assert out.confidence is None
        else:
            torch.testing.assert_close(out.confidence[p].double(), conf, rtol=1e-5, atol=1e-5, msg=f"anchor {p}")


# ------------------------------------------------------------------------ the mask


def deepspec_visible(anchor_positions, keep, seq_len, block_size):
    """DeepSpec's dspark_mask_mod as a plain loop: [B][q][kv] over its padded layout
    (queries num_blocks * block_size, keys seq_len + num_blocks * block_size)."""
    out = []
    for b in range(len(anchor_positions)):
        num_blocks = len(anchor_positions[b])
        rows = []
        for q in range(num_blocks * block_size):
            q_block = q // block_size
            row = []
            for kv in range(seq_len + num_blocks * block_size):
                context = kv < seq_len and kv < anchor_positions[b][q_block]
                draft = kv >= seq_len and (kv - seq_len) // block_size == q_block
                row.append((context or draft) and keep[b][q_block])
            rows.append(row)
        out.append(rows)
    return out


def packed_case(lengths, anchors_per_sequence, size, seed, drop=0.2):
    """A packed batch of `lengths` and the same batch padded as DeepSpec lays it out:
    sample b holds sequence b; its anchors (positions within it) and keep flags."""
    gen = torch.Generator().manual_seed(seed)
    bounds = sequence_bounds(lengths)
    positions, keep = [], []
    for n in lengths:
        picks = sorted(torch.randperm(n, generator=gen)[:anchors_per_sequence].tolist())
        picks += [0] * (anchors_per_sequence - len(picks))
        positions.append(picks)
        keep.append([bool(torch.rand(1, generator=gen) >= drop) for _ in picks])
    seq_id = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    anchors = torch.tensor([b0 + p for (b0, _), ps in zip(bounds, positions, strict=True) for p in ps])
    valid = torch.tensor([k for ks in keep for k in ks])
    return seq_id, anchors, valid, positions, keep


def packed_from_deepspec(lengths, positions, keep, size):
    """The packed rule [A * S, T + A * S] read off DeepSpec's padded one."""
    seq_len = max(lengths)
    ds = deepspec_visible(positions, keep, seq_len, size)
    bounds = sequence_bounds(lengths)
    total = sum(lengths)
    per = len(positions[0])
    num_anchors = per * len(lengths)
    want = torch.zeros(num_anchors * size, total + num_anchors * size, dtype=torch.bool)
    for b, (b0, b1) in enumerate(bounds):
        for n in range(per):
            for s in range(size):
                q_packed, q_padded = (b * per + n) * size + s, n * size + s
                for i in range(b1 - b0):  # context keys of sample b
                    want[q_packed, b0 + i] = ds[b][q_padded][i]
                for n2 in range(per):  # draft keys of sample b
                    for s2 in range(size):
                        want[q_packed, total + (b * per + n2) * size + s2] = ds[b][q_padded][seq_len + n2 * size + s2]
    return want


@pytest.mark.parametrize(
    "lengths,per,size,drop",
    [([7, 3, 9], 4, 3, 0.2), ([150, 90, 60], 30, 5, 0.2), ([400, 40], 100, 3, 0.0)],
    ids=["small", "several-blocks", "full-blocks"],
)
def test_the_mask_is_deepspecs(lengths, per, size, drop):
    seq_id, anchors, valid, positions, keep = packed_case(lengths, per, size, seed=len(lengths) + per, drop=drop)
    want = packed_from_deepspec(lengths, positions, keep, size)
    total = sum(lengths)
    # dense: the context part and the own-block part
    ctx = context_visible(seq_id, anchors, valid).repeat_interleave(size, 0)
    own = (
        torch.block_diag(*[torch.ones(size, size, dtype=torch.bool)] * anchors.shape[0])
        & valid.repeat_interleave(size)[:, None]
    )
    assert torch.equal(torch.cat([ctx, own], dim=1), want)
    # flex: mask_mod at every pair of its padded layout
    layout = FlexLayout(seq_id, anchors, valid, size)
    mask_mod = anchor_mask_mod(layout)
    nq, nkv = layout.q_valid.shape[0], layout.kv_block.shape[0]
    got = mask_mod(0, 0, torch.arange(nq)[:, None], torch.arange(nkv)[None, :])
    rows, ctx_padded = anchors.shape[0] * size, total + layout.ctx_pad
    assert torch.equal(got[:rows, :total], want[:, :total])
    assert torch.equal(got[:rows, ctx_padded : ctx_padded + rows], want[:, total:])
    assert not got[rows:].any() and not got[:, total:ctx_padded].any() and not got[:, ctx_padded + rows :].any()
    # the block mask: a superset of the visible blocks; full blocks all visible
    block_mask = anchor_block_mask(layout, mask_mod)
    blocks = got.view(nq // BLOCK, BLOCK, nkv // BLOCK, BLOCK)
    any_visible, all_visible = blocks.any(3).any(1), blocks.all(3).all(1)
    kept = torch.zeros_like(any_visible)
    full = torch.zeros_like(any_visible)
    for i in range(nq // BLOCK):
        kept[i, block_mask.kv_indices[0, 0, i, : block_mask.kv_num_blocks[0, 0, i]].long()] = True
        full[i, block_mask.full_kv_indices[0, 0, i, : block_mask.full_kv_num_blocks[0, 0, i]].long()] = True
    assert not (kept & full).any()
    assert torch.equal(any_visible & ~(kept | full), torch.zeros_like(any_visible))
    assert torch.equal(full & ~all_visible, torch.zeros_like(full))
    # The backward's per-key-block lists are the transpose of the same blocks.
    for num, indices, want_blocks in ((block_mask.q_num_blocks, block_mask.q_indices, kept),
                                      (block_mask.full_q_num_blocks, block_mask.full_q_indices, full)):  # fmt: skip
        got_blocks = torch.zeros_like(want_blocks.T)
        for j in range(num.shape[-1]):
            got_blocks[j, indices[0, 0, j, : num[0, 0, j]].long()] = True
        assert torch.equal(got_blocks, want_blocks.T)
    if drop == 0:
        assert full.any(), "no full block: the test does not reach the full-block rule"


def attention_case(seed, lengths=(150, 90, 60), per=30, size=5):
    seq_id, anchors, valid, _, _ = packed_case(list(lengths), per, size, seed)
    gen = torch.Generator().manual_seed(seed)
    total, num_anchors = sum(lengths), anchors.shape[0]
    q = torch.randn(num_anchors, size, 4, 16, generator=gen)
    ctx_k, ctx_v = torch.randn(total, 2, 16, generator=gen), torch.randn(total, 2, 16, generator=gen)
    own_k, own_v = (
        torch.randn(num_anchors, size, 2, 16, generator=gen),
        torch.randn(num_anchors, size, 2, 16, generator=gen),
    )
    return q, ctx_k, ctx_v, own_k, own_v, dict(seq_id=seq_id, anchors=anchors, anchor_valid=valid)


@pytest.mark.vectorised  # the CPU flex template needs Inductor's vector code (tests/conftest.py)
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_equals_dense_eager_and_compiled_on_cpu():
    """Inductor's CPU flex kernel with static shapes (under dynamic shapes torch
    2.13's C++ flex template fails to build; the CPU evaluation runs dense)."""
    args, kwargs = attention_case(3)[:5], attention_case(3)[5]
    dense = block_attention(*args, **kwargs, backend="dense")
    assert not dense[~kwargs["anchor_valid"]].any(), "a padding anchor's block must be zeros"
    eager = block_attention(*args, **kwargs, backend="flex")
    torch.testing.assert_close(eager, dense, rtol=1e-5, atol=1e-5)
    compiled = torch.compile(lambda *a: block_attention(*a, **kwargs, backend="flex"), fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(*args), dense, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_block_forward_flex_equals_dense():
    head = make_block_head(True, "gated", True, False)
    batch = make_block_batch(head, LENGTHS, seed=2)
    anchors, valid = start_anchors(batch.cu_seqlens, sum(LENGTHS))
    with torch.no_grad():
        args = (head, batch.token_ids, batch.hidden_states, batch.positions, batch.cu_seqlens, anchors, valid)
        dense, flex = (block_forward(*args, tokens="draft", attention=a) for a in ("dense", "flex"))
    torch.testing.assert_close(flex.logits[valid], dense.logits[valid], rtol=1e-5, atol=1e-5)
    assert torch.equal(flex.draft_tokens[valid], dense.draft_tokens[valid])


def test_every_flex_call_asks_for_triton_and_captures_stored_buffers():
    """In the graph Inductor receives for the compiled forward (dynamic shapes):
    one flex_attention per layer, each asking for the main Triton kernel (never
    flex_decoding) and capturing only specdraft::materialize outputs (stored
    buffers, never expressions Inductor would inline into the flex template)."""
    from torch._dynamo.backends.common import aot_autograd

    from specdraft.testing import fresh_compile
    from specdraft.training import block_forward_for_eval

    head = make_block_head(True, "vanilla", True, True, head_dim=16)
    batch = make_block_batch(head, LENGTHS, seed=8)
    anchors, valid = start_anchors(batch.cu_seqlens, sum(LENGTHS))
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fn = fresh_compile(lambda *a: block_forward_for_eval(head, *a, attention="flex").logits,
                       backend=aot_autograd(fw_compiler=record), fullgraph=True, dynamic=True)  # fmt: skip
    fn(batch.token_ids, batch.hidden_states, batch.positions, batch.cu_seqlens, anchors, valid)
    nodes = [n for g in graphs for n in g.graph.nodes if n.op == "call_function" and "flex_attention" in str(n.target)]
    assert len(nodes) == head.config.num_layers
    for node in nodes:
        options = next(a for a in node.args if isinstance(a, dict))
        assert options.get("BACKEND") == "TRITON", options
        tensors = [b for b in node.args[-1] if isinstance(b.meta.get("val"), torch.Tensor)]
        assert len(tensors) == 7  # the mask's seven index tensors
        for buffer in tensors:
            assert buffer.op == "call_function" and "materialize" in str(buffer.target), buffer


@pytest.mark.cuda
def test_compiled_training_through_flex_on_cuda():
    """On CUDA with dynamic=True, attention "auto" (the fused flex kernel): the DSpark
    loss, forward and backward, at three batch shapes, equal to eager dense with its
    gradients, in one compile; the compiled evaluation equals the eager one."""
    import copy

    from specdraft.testing import CompileCounts, fresh_compile
    from specdraft.training import DraftEvaluator

    head = make_block_head(True, "rnn", True, True, head_dim=16).cuda()
    eager_head = copy.deepcopy(head)

    def loss_fn(h, batch, anchors, keep, attention):
        out = block_forward(h, batch.token_ids, batch.hidden_states, batch.positions, batch.cu_seqlens, anchors, keep,
                            attention=attention)  # fmt: skip
        labels = block_labels(batch.token_ids, batch.cu_seqlens, anchors, keep, block_size=h.block_size,
                              loss_mask=batch.loss_mask)  # fmt: skip
        return block_loss(out.logits, labels, target_logits=aligned_target_logits(batch.target_logits, labels),
                          confidence=out.confidence, weights=DSPARK_LOSS).loss  # fmt: skip

    compiled = fresh_compile(loss_fn, fullgraph=True, dynamic=True)
    with CompileCounts.measure() as counts:
        for seed, lengths in enumerate([[300], [37, 190], [40, 5, 60, 33, 71, 12, 90, 130]]):
            batch = make_block_batch(head, lengths, seed=seed, loss_mask=True).to("cuda")
            anchors, keep = sample_anchors(batch.cu_seqlens, sum(lengths), 64, batch.loss_mask)
            want = loss_fn(eager_head, batch, anchors, keep, "dense")
            want.backward()
            got = compiled(head, batch, anchors, keep, "auto")
            got.backward()
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            for (name, p), q in zip(head.named_parameters(), eager_head.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=f"{lengths} {name}")
            head.zero_grad(set_to_none=True)
            eager_head.zero_grad(set_to_none=True)
    assert counts.graph_breaks == 0 and counts.compiles == 1
    evaluator = DraftEvaluator(head, num_steps=head.block_size, temperature=0.7)
    eager = DraftEvaluator(head, num_steps=head.block_size, temperature=0.7, compile=False)
    for seed, lengths in enumerate([[300], [37, 190]]):
        batch = make_block_batch(head, lengths, seed=seed, loss_mask=True).to("cuda")
        got, want = evaluator(batch), eager(batch)
        for name, a, b in zip(got._fields, got, want, strict=True):
            if name in ("count", "starts"):
                assert torch.equal(a, b), name
            else:  # flex and dense may split a near-tie differently: a draft or two
                torch.testing.assert_close(a, b, rtol=2e-2, atol=2.0, msg=name)


# ---------------------------------------------------------- anchors, labels, losses


def test_start_anchors_and_candidates():
    cu = torch.tensor([0, 9, 13, 25])
    anchors, valid = start_anchors(cu, 25)
    bounds = sequence_bounds(LENGTHS)
    for t in range(25):
        b0, b1 = next((a, b) for a, b in bounds if a <= t < b)
        assert int(anchors[t]) == min(t + 1, 24) and bool(valid[t]) == (t + 1 < b1)
    loss_mask = torch.rand(25, generator=torch.Generator().manual_seed(0)) > 0.3
    for mask in (None, loss_mask):
        got = anchor_candidates(cu, 25, mask)
        for p in range(25):
            b0, b1 = next((a, b) for a, b in bounds if a <= p < b)
            # DeepSpec: the anchor token (row p, predicted at row p - 1) and the first
            # drafted token (row p + 1, predicted at row p) are both trained tokens.
            ok = b0 < p and p + 1 < b1 and (mask is None or (bool(mask[p - 1]) and bool(mask[p])))
            assert bool(got[p]) == ok, p


@pytest.mark.parametrize("num_anchors", [4, 12, 40])
def test_sampled_anchors_follow_deepspecs_rule(num_anchors):
    cu = torch.tensor([0, 9, 13, 25])
    loss_mask = torch.rand(25, generator=torch.Generator().manual_seed(1)) > 0.2
    candidates = set(anchor_candidates(cu, 25, loss_mask).nonzero().flatten().tolist())
    seen = set()
    for seed in range(20):
        anchors, keep = sample_anchors(cu, 25, num_anchors, loss_mask, generator=torch.Generator().manual_seed(seed))
        assert anchors.shape == keep.shape == (num_anchors,)
        kept = anchors[keep].tolist()
        assert kept == sorted(set(kept)) and set(kept) <= candidates  # distinct, ascending, candidates only
        assert len(kept) == min(num_anchors, len(candidates))
        assert keep.tolist() == [i < len(kept) for i in range(num_anchors)] and not anchors[~keep].any()
        seen |= set(kept)
    assert seen == candidates  # every candidate gets drawn


def labels_loop(ids, lengths, anchors, valid, size, loss_mask):
    """DeepSpec's target_ids and eval_mask (build_eval_mask) per anchor, over the
    packed sequences, as loops; loss_mask over target rows (row j: token j + 1)."""
    bounds = sequence_bounds(lengths)
    targets, masks = [], []
    for p, ok in zip(anchors.tolist(), valid.tolist(), strict=True):
        b0, b1 = next((a, b) for a, b in bounds if a <= p < b)
        row_t, row_m, alive = [], [], ok
        for s in range(size):
            label = p + s + 1
            alive = alive and label < b1 and (loss_mask is None or bool(loss_mask[label - 1]))
            row_m.append(alive)
            row_t.append(int(ids[min(label, b1 - 1)]))
        targets.append(row_t)
        masks.append(row_m)
    return targets, masks


def losses_loop(logits, targets, masks, target_logits, confidence, weights):
    """DeepSpec's compute_dspark_loss (one process) in float64 loops."""
    sums = dict(w=0.0, ce=0.0, l1=0.0, bce=0.0)
    for a in range(len(targets)):
        for s in range(len(targets[a])):
            if not masks[a][s]:
                continue
            w = math.exp(-s / weights.loss_decay_gamma) if weights.loss_decay_gamma else 1.0
            row = logits[a, s].double()
            sums["w"] += w
            sums["ce"] += w * -torch.log_softmax(row, -1)[targets[a][s]].item()
            l1 = (torch.softmax(row, -1) - torch.softmax(target_logits[a, s].double(), -1)).abs().sum().item()
            sums["l1"] += w * l1
            if confidence is not None:
                y = min(max(1 - l1 / 2, 0.0), 1.0)
                x = confidence[a, s].double().item()
                sig = 1 / (1 + math.exp(-x))
                sums["bce"] += w * -(y * math.log(sig) + (1 - y) * math.log(1 - sig))
    den = sums["w"] + 1e-6
    ce, l1, bce = sums["ce"] / den, sums["l1"] / den, sums["bce"] / den
    l1 = l1 if weights.l1 > 0 else 0.0
    return weights.ce * ce + weights.l1 * l1 + weights.confidence * bce, ce, l1, bce


@pytest.mark.parametrize("weights", [DFLASH_LOSS, DSPARK_LOSS, BlockLossWeights(None, 0.3, 0.5, 0.2)],
                         ids=["dflash", "dspark", "no-decay"])  # fmt: skip
def test_labels_and_losses_equal_deepspecs_formulas(weights):
    head = make_block_head(True, "rnn", True, True)
    batch = make_block_batch(head, LENGTHS, seed=4, target_scale=3.0, loss_mask=True)
    anchors, keep = sample_anchors(
        batch.cu_seqlens, 25, 14, batch.loss_mask, generator=torch.Generator().manual_seed(2)
    )
    anchors[3], keep[3] = 8, True  # a sequence's last row: no label inside it
    labels = block_labels(batch.token_ids, batch.cu_seqlens, anchors, keep, block_size=head.block_size,
                          loss_mask=batch.loss_mask)  # fmt: skip
    targets, masks = labels_loop(batch.token_ids, LENGTHS, anchors, keep, head.block_size, batch.loss_mask)
    assert labels.eval_mask.tolist() == masks
    assert labels.target_ids.tolist() == targets
    assert 10 < sum(map(sum, masks)) < anchors.shape[0] * head.block_size  # gaps and supervised rows both
    with torch.no_grad():
        out = block_forward(head, batch.token_ids, batch.hidden_states, batch.positions, batch.cu_seqlens, anchors,
                            keep)  # fmt: skip
    aligned = aligned_target_logits(batch.target_logits, labels)
    for a, p in enumerate(anchors.tolist()):  # the target's prediction of each label: row label - 1
        for s in range(head.block_size):
            if masks[a][s]:
                assert torch.equal(aligned[a, s], batch.target_logits[p + s])
    confidence = out.confidence if weights.confidence > 0 else None
    got = block_loss(out.logits, labels, target_logits=aligned, confidence=confidence, weights=weights)
    want = losses_loop(out.logits, targets, masks, aligned, confidence, weights)
    for name, value, expected in zip(("loss", "ce", "l1", "confidence"), got[:4], want, strict=True):
        assert value.item() == pytest.approx(expected, rel=1e-5, abs=1e-6), name


def test_loss_arguments_are_checked():
    head = make_block_head(True, "vanilla", True, True)
    batch = make_block_batch(head, LENGTHS, seed=5)
    anchors, keep = start_anchors(batch.cu_seqlens, 25)
    labels = block_labels(batch.token_ids, batch.cu_seqlens, anchors, keep, block_size=head.block_size)
    logits = torch.zeros(25, head.block_size, head.config.vocab_size)
    with pytest.raises(ValueError, match="target_logits: needed"):
        block_loss(logits, labels, weights=DSPARK_LOSS)
    with pytest.raises(ValueError, match="weights must be a BlockLossWeights"):
        block_loss(logits, labels, weights=(4.0, 1.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="head must be a BlockDraftHead"):
        block_forward(torch.nn.Linear(2, 2), batch.token_ids, batch.hidden_states, batch.positions,
                      batch.cu_seqlens, anchors)  # fmt: skip
    with pytest.raises(ValueError, match="hidden_states must have shape"):
        block_forward(head, batch.token_ids, batch.hidden_states[:, :5], batch.positions, batch.cu_seqlens, anchors)


def test_a_few_training_steps_lower_the_dspark_loss():
    head = make_block_head(True, "gated", True, True)
    head.train()
    batch = make_block_batch(head, LENGTHS, seed=6, target_scale=3.0)
    anchors, keep = sample_anchors(batch.cu_seqlens, 25, 16, generator=torch.Generator().manual_seed(3))
    labels = block_labels(batch.token_ids, batch.cu_seqlens, anchors, keep, block_size=head.block_size)
    aligned = aligned_target_logits(batch.target_logits, labels)
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    losses = []
    for step in range(12):
        out = block_forward(head, batch.token_ids, batch.hidden_states, batch.positions, batch.cu_seqlens, anchors,
                            keep)  # fmt: skip
        loss = block_loss(out.logits, labels, target_logits=aligned, confidence=out.confidence,
                          weights=DSPARK_LOSS).loss  # fmt: skip
        loss.backward()
        if step == 0:
            for name, p in head.named_parameters():
                assert p.grad is not None and bool(p.grad.abs().sum() > 0), f"no gradient at {name}"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
