"""A block drafter's training forward (DFlash, DSpark: specdraft.models.heads.block),
its labels and DeepSpec's losses, over a packed batch.

    anchors, keep = sample_anchors(cu_seqlens, T, num_anchors, loss_mask)   # or start_anchors
    out = block_forward(head, token_ids, hidden_states, positions, cu_seqlens, anchors, keep)
    labels = block_labels(token_ids, cu_seqlens, anchors, keep, block_size=head.block_size, loss_mask=loss_mask)
    loss = block_loss(out.logits, labels, target_logits=aligned_target_logits(target_logits, labels),
                      confidence=out.confidence, weights=DSPARK_LOSS).loss

The packed batch is TargetBatch's (specdraft.training.shards): token_ids [T],
hidden_states [T, len(target_layer_ids) * H_target] (the head's aux layers,
`head.block.aux_layers`, concatenated), positions [T] (each sequence from 0),
cu_seqlens [S + 1], target_logits [T, V] (row j predicts token j + 1) and
loss_mask [T] over target rows (row j: the prediction of token j + 1 is scored).

An *anchor* is a row p: its block is what a serving proposer (BlockProposer) drafts
for a request whose context is p's sequence before p and whose newest token is
token p: the rows [token p, mask x (S - 1)] at positions p .. p + S - 1, attending
to the context's keys (each layer's context_kv of hidden_norm(fc(aux)) of the rows
before p) and to the block (specdraft.training.block_attention). Block row s drafts
the token at row p + s + 1 (DeepSpec's label), which the target predicts at row
p + s. DeepSpec's training forward (its Qwen3DSparkModel.forward) samples the
anchors per padded sample; here they index the packed rows.

The Markov head (DSpark) reads each row's previous token: the data's (tokens="data",
DeepSpec's teacher forcing: row s reads token p + s) or the block's own greedy
drafts in order (tokens="draft", as a proposer drafts with greedy sampling).

Everything is static-shaped (A anchors, S rows) and free of host syncs: it compiles
with fullgraph=True, and differentiates with respect to the head's parameters
(a training step) wherever autograd is on.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, check_choice, check_int_range, check_tensor_arg
from specdraft.models.heads import BlockDraftHead
from specdraft.training.attention import BACKENDS
from specdraft.training.block_attention import block_attention
from specdraft.training.unroll import TOKEN_MODES, PackedLayout


class BlockOutput(NamedTuple):
    """Per anchor a and block row s.

    logits [A, S, V]: the draft logits (DSpark: base + the Markov bias from each
    row's previous token, `prev_tokens`), in the head's dtype.
    hidden [A, S, H]: the final-normed hidden states (what lm_head reads).
    draft_tokens [A, S] int64: the greedy draft of each row (argmax of logits).
    prev_tokens [A, S] int64: the previous token each row's Markov / confidence head
    read (row 0: the anchor's token).
    confidence [A, S] fp32: DSpark's survival logits, or None without a confidence head.
    anchor_valid [A] bool: the anchors whose blocks were computed (the others see
    nothing; their rows are not meaningful).
    """

    logits: torch.Tensor
    hidden: torch.Tensor
    draft_tokens: torch.Tensor
    prev_tokens: torch.Tensor
    confidence: torch.Tensor | None
    anchor_valid: torch.Tensor


class BlockLabels(NamedTuple):
    """DeepSpec's supervision of each block row (a, s): target_ids [A, S] int64, the
    data token at row anchor + s + 1; target_rows [A, S] int64, the row anchor + s
    whose target logits predict it (both held inside the anchor's sequence);
    eval_mask [A, S] bool, DeepSpec's eval_mask: the anchor is valid, row
    anchor + s + 1 lies in its sequence and loss_mask[anchor + s] is set, for rows
    0 .. s all (a cumulative product: a block is supervised up to its first gap)."""

    target_ids: torch.Tensor
    target_rows: torch.Tensor
    eval_mask: torch.Tensor


class BlockLossWeights(NamedTuple):
    """DeepSpec's loss settings (its config's model.loss_decay_gamma, ce_loss_alpha,
    l1_loss_alpha, confidence_head_alpha). loss_decay_gamma None or <= 0: no decay."""

    loss_decay_gamma: float | None = 4.0
    ce: float = 1.0
    l1: float = 0.0
    confidence: float = 0.0


# DeepSpec's released configs (config/dflash/*.py, config/dspark/*.py).
DFLASH_LOSS = BlockLossWeights(loss_decay_gamma=4.0, ce=1.0, l1=0.0, confidence=0.0)
DSPARK_LOSS = BlockLossWeights(loss_decay_gamma=4.0, ce=0.1, l1=0.9, confidence=1.0)


class BlockLoss(NamedTuple):
    """loss: ce * CE + l1 * L1 + confidence * BCE (the weights'); the three terms,
    each a weighted mean over the supervised rows (0 where not computed);
    accept_rate [A, S] fp32: 1 - L1 / 2 = sum_x min(p, q) of draft and target at
    temperature 1, clamped to [0, 1], detached (the confidence head's target), or
    None without target logits."""

    loss: torch.Tensor
    ce: torch.Tensor
    l1: torch.Tensor
    confidence: torch.Tensor
    accept_rate: torch.Tensor | None


# ------------------------------------------------------------------------- anchors


def start_anchors(cu_seqlens: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchors [T] int64, valid [T] bool): for every row t the anchor t + 1, valid
    when that row is in t's sequence. Block a then drafts what the unroll's chain
    start t drafts (specdraft.training.unroll: the window ends at t, the next token is
    t + 1), so its logits line up with draft_metrics' [K, T] alignment."""
    layout = PackedLayout.from_cu_seqlens(cu_seqlens, num_tokens)
    rows = torch.arange(num_tokens, device=cu_seqlens.device)
    in_batch = layout.seq_id < cu_seqlens.shape[0] - 1
    return (rows + 1).clamp(max=num_tokens - 1), (rows + 1 < layout.end) & in_batch


def anchor_candidates(cu_seqlens: torch.Tensor, num_tokens: int, loss_mask: torch.Tensor | None = None):
    """[T] bool: rows DeepSpec may anchor a block at. Its rule over a sample's tokens
    is: the anchor token and the first drafted token are both trained tokens. With
    loss_mask over target rows (loss_mask[j]: token j + 1 is trained), that is row
    p - 1 in p's sequence with loss_mask[p - 1], and row p + 1 in it with
    loss_mask[p]; without a loss_mask every token but each sequence's first is
    trained."""
    layout = PackedLayout.from_cu_seqlens(cu_seqlens, num_tokens)
    rows = torch.arange(num_tokens, device=cu_seqlens.device)
    ok = (rows > layout.start) & (rows + 1 < layout.end) & (layout.seq_id < cu_seqlens.shape[0] - 1)
    if loss_mask is not None:
        scored = loss_mask != 0
        ok = ok & scored & torch.cat([scored.new_zeros(1), scored[:-1]])
    return ok


def sample_anchors(
    cu_seqlens: torch.Tensor,
    num_tokens: int,
    num_anchors: int,
    loss_mask: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchors [num_anchors] int64 ascending, keep [num_anchors] bool): DeepSpec's
    sample_anchor_positions over a packed batch. num_anchors distinct candidates
    (`anchor_candidates`) drawn uniformly (torch.rand with `generator`), sorted; when
    there are fewer candidates, all of them, then padding anchors (row 0, keep
    False). Static shapes, no host sync; under torch.compile pass no generator
    (Dynamo cannot take one: torch's global RNG, seeded by torch.manual_seed)."""
    check_int_range("num_anchors", num_anchors, 1)
    candidates = anchor_candidates(cu_seqlens, num_tokens, loss_mask)
    device = candidates.device
    keys = torch.rand(num_tokens, generator=generator, device=device if generator is None else generator.device)
    keys = torch.where(candidates, keys.to(device), 2.0)
    order = torch.argsort(keys, stable=True)
    rows = torch.where(candidates, torch.arange(num_tokens, device=device), num_tokens + 1).index_select(0, order)
    if num_tokens < num_anchors:
        rows = F.pad(rows, (0, num_anchors - num_tokens), value=num_tokens + 1)
    chosen = rows[:num_anchors].sort().values
    keep = torch.arange(num_anchors, device=device) < candidates.sum().clamp(max=num_anchors)
    return torch.where(keep, chosen, 0), keep


# -------------------------------------------------------------------- the forward


def block_forward(
    head: torch.nn.Module,
    token_ids: torch.Tensor,
    hidden_states: torch.Tensor,
    positions: torch.Tensor,
    cu_seqlens: torch.Tensor,
    anchors: torch.Tensor,
    anchor_valid: torch.Tensor | None = None,
    *,
    tokens: str = "data",
    attention: str = "auto",
) -> BlockOutput:
    """The blocks of `anchors` [A] (rows of the packed batch; anchor_valid [A] bool,
    None: all valid) in one forward of the head's layers (module docstring).
    tokens: "data" (teacher forcing, DeepSpec's training forward) or "draft" (the
    Markov head reads the block's own greedy drafts). attention: "auto", "dense" or
    "flex" (specdraft.training.block_attention). Anchors outside the batch's
    sequences are invalid; anchor rows are clamped into [0, T)."""
    check_choice("tokens", tokens, TOKEN_MODES)
    check_choice("attention", attention, BACKENDS)
    check_block_head(head)
    check_tensor_arg("token_ids", token_ids, INDEX_DTYPES, rank=1)
    num_tokens = token_ids.shape[0]
    check_tensor_arg("hidden_states", hidden_states, FLOAT_DTYPES, shape=(num_tokens, head.hidden_width),
                     device_of=token_ids)  # fmt: skip
    check_tensor_arg("positions", positions, INDEX_DTYPES, shape=(num_tokens,), device_of=token_ids)
    check_tensor_arg("cu_seqlens", cu_seqlens, INDEX_DTYPES, rank=1, device_of=token_ids)
    if cu_seqlens.shape[0] < 2:
        raise ValueError(f"cu_seqlens must hold S + 1 >= 2 entries, got {cu_seqlens.shape[0]}")
    check_tensor_arg("anchors", anchors, INDEX_DTYPES, rank=1, device_of=token_ids)
    check_tensor_arg("anchor_valid", anchor_valid, torch.bool, shape=(anchors.shape[0],), device_of=token_ids,
                     optional=True)  # fmt: skip

    layout = PackedLayout.from_cu_seqlens(cu_seqlens, num_tokens)
    token_ids = token_ids.long().clamp(0, head.config.vocab_size - 1)
    anchors = anchors.long().clamp(0, num_tokens - 1)
    valid = layout.seq_id.index_select(0, anchors) < cu_seqlens.shape[0] - 1
    valid = valid if anchor_valid is None else valid & anchor_valid
    size = head.block_size
    offsets = torch.arange(size, device=token_ids.device)
    anchor_tokens = token_ids.index_select(0, anchors)
    input_ids = torch.where(offsets == 0, anchor_tokens[:, None], head.block.mask_token_id)  # [A, S]
    block_positions = positions.long().index_select(0, anchors)[:, None] + offsets

    hidden = block_hidden_states(head, input_ids, block_positions, hidden_states, positions.long(), layout, anchors,
                                 valid, attention)  # fmt: skip
    base = head.compute_logits(hidden)
    if head.markov_head is not None and tokens == "draft":
        logits, drafts, prev = greedy_markov_chain(head, base, hidden, anchor_tokens)
    else:
        prev = data_prev_tokens(token_ids, layout, anchors, size)
        logits = base if head.markov_head is None else base + head.markov_bias(prev, hidden)
        drafts = logits.detach().argmax(dim=-1)
        if tokens == "draft":  # DFlash: nothing read them; the tokens a proposer would feed
            prev = torch.cat([anchor_tokens[:, None], drafts[:, :-1]], dim=1)
    confidence = head.confidence_logits(hidden, prev)
    return BlockOutput(logits, hidden, drafts, prev, confidence, valid)


def check_block_head(head: object) -> None:
    if not isinstance(head, BlockDraftHead):
        raise ValueError(f"head must be a BlockDraftHead (DFlash / DSpark), got {type(head).__name__}")
    if head.missing_weights:
        raise ValueError(
            f"head has no {', '.join(sorted(head.missing_weights))}: the checkpoint did not include them; "
            "call head.share_from(target) first"
        )


def block_hidden_states(head, input_ids, block_positions, hidden_states, positions, layout, anchors, valid, attention):
    """[A, S, H]: the head's layers over every block at once, each layer's
    attention over the context keys of every row and the blocks' own keys."""
    num_anchors, size = input_ids.shape
    context = head.project_context(hidden_states)
    scale = head.attention_scale

    def attend_for_layer(i):
        ctx_keys, ctx_values = head.context_kv(i, positions, context)

        def attend(q, k, v):
            out = block_attention(
                q.view(num_anchors, size, *q.shape[1:]), ctx_keys, ctx_values, k.view(num_anchors, size, *k.shape[1:]),
                v.view(num_anchors, size, *v.shape[1:]), seq_id=layout.seq_id, anchors=anchors, anchor_valid=valid,
                backend=attention, scale=scale,
            )  # fmt: skip
            return out.reshape(num_anchors * size, *out.shape[2:])

        return attend

    hidden = head.block_hidden(input_ids.reshape(-1), block_positions.reshape(-1), attend_for_layer)
    return hidden.view(num_anchors, size, -1)


def data_prev_tokens(token_ids, layout: PackedLayout, anchors, size: int) -> torch.Tensor:
    """[A, S] int64: the data token before each block row's target, token
    anchor + s (held at the sequence's last row)."""
    rows = anchors[:, None] + torch.arange(size, device=anchors.device)
    rows = torch.minimum(rows, layout.end.index_select(0, anchors)[:, None] - 1).clamp(min=0)
    return token_ids[rows]


def greedy_markov_chain(head, base, hidden, anchor_tokens):
    """DSpark drafting greedily: row s's Markov bias from the token drafted at row
    s - 1 (row 0: the anchor's token), in order. Returns (logits, drafts, prev)."""
    markov = head.markov_head
    prev, state = anchor_tokens, None
    rows, drafts, prevs = [], [], []
    for s in range(base.shape[1]):
        latent, state = markov.latent_step(prev, hidden[:, s], state)
        row = base[:, s] + markov.markov_w2(latent)
        prevs.append(prev)
        prev = row.detach().argmax(dim=-1)
        rows.append(row)
        drafts.append(prev)
    return torch.stack(rows, dim=1), torch.stack(drafts, dim=1), torch.stack(prevs, dim=1)


@torch.no_grad()
def block_forward_for_eval(head, token_ids, hidden_states, positions, cu_seqlens, anchors, anchor_valid=None, *,
                           tokens: str = "draft", attention: str = "auto") -> BlockOutput:  # fmt: skip
    """`block_forward` for evaluation: the head's own drafts by default, and never
    differentiable (no autograd graph, no tensor that requires grad), whatever the
    caller's grad mode."""
    return block_forward(head, token_ids, hidden_states, positions, cu_seqlens, anchors, anchor_valid, tokens=tokens,
                         attention=attention)  # fmt: skip


# -------------------------------------------------------------------- the labels


def block_labels(
    token_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    anchors: torch.Tensor,
    anchor_valid: torch.Tensor | None = None,
    *,
    block_size: int,
    loss_mask: torch.Tensor | None = None,
) -> BlockLabels:
    """DeepSpec's labels and eval_mask of the blocks of `anchors` (BlockLabels)."""
    check_int_range("block_size", block_size, 1)
    num_tokens = token_ids.shape[0]
    layout = PackedLayout.from_cu_seqlens(cu_seqlens, num_tokens)
    anchors = anchors.long().clamp(0, num_tokens - 1)
    end = layout.end.index_select(0, anchors)[:, None]
    valid = layout.seq_id.index_select(0, anchors) < cu_seqlens.shape[0] - 1
    valid = valid if anchor_valid is None else valid & anchor_valid
    label_rows = anchors[:, None] + torch.arange(1, block_size + 1, device=anchors.device)  # [A, S]
    supervised = (label_rows < end) & valid[:, None]
    if loss_mask is not None:
        scored = F.pad(loss_mask != 0, (0, block_size + 1))
        supervised = supervised & scored[label_rows - 1]
    eval_mask = torch.cumprod(supervised.to(torch.int32), dim=-1).bool()
    # Rows past the sequence (never supervised) read its last row, as DeepSpec clamps.
    safe_rows = torch.minimum(label_rows, end - 1).clamp(0, num_tokens - 1)
    return BlockLabels(token_ids.long()[safe_rows], (safe_rows - 1).clamp(min=0), eval_mask)


def aligned_target_logits(target_logits: torch.Tensor, labels: BlockLabels) -> torch.Tensor:
    """[A, S, V]: the target's logits at each block row's target row (DeepSpec's
    aligned_target_logits: the target's prediction of the row's label)."""
    return target_logits[labels.target_rows]


# -------------------------------------------------------------------- the losses


def loss_weights(eval_mask: torch.Tensor, loss_decay_gamma: float | None) -> torch.Tensor:
    """[A, S] fp32: eval_mask times exp(-s / gamma) (DeepSpec's positional decay)."""
    weights = eval_mask.float()
    if loss_decay_gamma is not None and loss_decay_gamma > 0:
        positions = torch.arange(eval_mask.shape[-1], device=eval_mask.device, dtype=torch.float32)
        weights = weights * torch.exp(-positions / float(loss_decay_gamma))
    return weights


def weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """DeepSpec's sum(values * weights) / (sum(weights) + 1e-6)."""
    return (values * weights).sum() / (weights.sum() + 1e-6)


def block_loss(
    logits: torch.Tensor,
    labels: BlockLabels,
    *,
    target_logits: torch.Tensor | None = None,
    confidence: torch.Tensor | None = None,
    weights: BlockLossWeights = DFLASH_LOSS,
) -> BlockLoss:
    """DeepSpec's block-drafter loss (its compute_dspark_loss, one process):

    - CE: cross-entropy of logits [A, S, V] against labels.target_ids;
    - L1: || softmax(logits) - softmax(target_logits) ||_1 (target_logits [A, S, V],
      `aligned_target_logits`), needed when weights.l1 > 0;
    - confidence: binary cross-entropy of the confidence logits [A, S] against the
      detached accept rate 1 - L1 / 2 (clamped to [0, 1]), needed with a confidence
      head (then target_logits too);

    each a mean over the supervised rows weighted by eval_mask x exp(-s / gamma),
    and loss = ce * CE + l1 * L1 + confidence * BCE. Floats in fp32."""
    if not isinstance(weights, BlockLossWeights):
        raise ValueError(f"weights must be a BlockLossWeights, got {type(weights).__name__}")
    if target_logits is None and (weights.l1 > 0 or confidence is not None):
        raise ValueError("target_logits: needed for the L1 term (weights.l1 > 0) and the confidence loss")
    w = loss_weights(labels.eval_mask, weights.loss_decay_gamma)
    flat = logits.float().reshape(-1, logits.shape[-1])
    ce = weighted_mean(F.cross_entropy(flat, labels.target_ids.reshape(-1), reduction="none"), w.reshape(-1))
    zero = ce.new_zeros(())
    l1, accept_rate, conf_loss = zero, None, zero
    if target_logits is not None:
        distance = (torch.softmax(logits.float(), dim=-1) - torch.softmax(target_logits.float(), dim=-1)).abs().sum(-1)
        accept_rate = (1.0 - 0.5 * distance.detach()).clamp(0.0, 1.0)
        if weights.l1 > 0:
            l1 = weighted_mean(distance, w)
    if confidence is not None:
        bce = F.binary_cross_entropy_with_logits(confidence.float(), accept_rate, reduction="none")
        conf_loss = weighted_mean(bce, w)
    loss = weights.ce * ce + weights.l1 * l1 + weights.confidence * conf_loss
    return BlockLoss(loss, ce, l1, conf_loss, accept_rate)
