"""The training-time unroll ("training-time test"): the K-step draft chains that
start at every position of a packed batch, computed at once on the serving heads.

A packed batch is S sequences laid end to end: token_ids [T], the target's hidden
states [T, H_target] (EAGLE-3: its aux layers concatenated, [T, 3 * H]), positions
[T] or M-RoPE [3, T], and cu_seqlens [S + 1] (sequence i is rows cu_seqlens[i] ..
cu_seqlens[i + 1] - 1). The chain that starts at row t is what a proposer drafts for
a request whose window is its sequence up to t and whose next token is the data
token t + 1:

- step 0 reads (token t + 1, hidden t) at position t, over the sequence's rows <= t
  (the first pass, shared by every chain);
- `loop="eagle"` (EAGLE-1, EAGLE-3, MTP with one layer; `EagleProposer`): step k
  feeds one token at position t + k (every M-RoPE row advanced by k, as
  `step_metadata` does) with the hidden state step k - 1 returned for the next step,
  attending to the first pass's rows <= t and to its own chain's steps 1 .. k;
- `loop="multi_layer"` (MTP heads with n_predict layers; `MultiLayerEagleProposer`):
  pass k runs layer k % n_predict over the window again, ids shifted by one more
  (the chain's drafts entering at its end), each row reading pass k - 1's output
  at that row. The rows up to t - k read data only and are shared by every chain;
  the last k rows of chain t are its own (attention: shared rows <= t - k, own rows
  up to the query's).

tokens="data" feeds the data token t + k + 1 at step k (teacher forcing); "draft"
feeds the chain's own greedy draft of step k - 1, which is what `propose` does with
greedy draft sampling: then draft_tokens[k, t] is propose's k-th draft for the
request that ends at t (any t with t + 1 in its sequence). The draft rule for M-RoPE
follows the proposers; the max_model_len clamp of `step_metadata` is not modelled
(training sequences are shorter than the model's limit).

Step k at row t drafts the token at row t + k + 2, which the target predicts from
row t + k + 1: `valid[k, t]` says that row exists in t's sequence.

Every pass is the head's own draft step (DraftHead.step, the one serving runs),
handed the unroll's attention (ContextAttention, ChainStepAttention,
OwnRowsAttention) in place of the paged cache's. That attention is
specdraft.training.attention: all T chains of a step in one call, the first pass's
(or the shared rows') keys as context plus one diagonal block per earlier chain
step. Why not the paged KV cache of specdraft.models: it attends one request window
at a time, so T chains would gather T copies of their prefix ([T, L] keys per
step), and training would write autograd-tracked keys into cache buffers.
Here nothing is cached: every tensor is a function of the inputs, so a training step
differentiates through it and an evaluation leaves no state behind.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdraft.checks import INDEX_DTYPES, check_choice, check_int_range, check_tensor_arg
from specdraft.layout import position_rows, sequence_of
from specdraft.models.heads import DraftHead
from specdraft.training.attention import BACKENDS, chain_attention

TOKEN_MODES = ("data", "draft")
LOOPS = ("eagle", "multi_layer")


class UnrollOutput(NamedTuple):
    """Per step k and chain start t.

    logits [K, T, V_draft]: draft logits (EAGLE-3: over its draft vocabulary, map with
    d2t; the target vocabulary otherwise); None when return_logits=False.
    hidden [K, T, H]: the hidden state each step samples from (what compute_logits reads).
    draft_tokens [K, T] int64: each step's greedy draft, in the target vocabulary.
    valid [K, T] bool: row t + k + 1 (where the target predicts the drafted token)
    lies in t's sequence (never for padding rows past cu_seqlens[-1]).
    """

    logits: torch.Tensor | None
    hidden: torch.Tensor
    draft_tokens: torch.Tensor
    valid: torch.Tensor


class PackedLayout(NamedTuple):
    """Per row: its sequence, and that sequence's first row and end (exclusive)."""

    seq_id: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: torch.Tensor, num_tokens: int) -> PackedLayout:
        # Rows past cu_seqlens[-1] form one more sequence that ends at T, and every
        # index is clamped: unchecked values never read out of bounds.
        rows = torch.arange(num_tokens, device=cu_seqlens.device)
        bounds = torch.cat([cu_seqlens.long(), rows.new_full((1,), num_tokens)]).clamp(0, num_tokens)
        seq_id = sequence_of(rows, bounds[:-1]).clamp(min=0)
        return cls(seq_id, bounds.index_select(0, seq_id), bounds.index_select(0, seq_id + 1))

    def shifted(self, offset: int) -> torch.Tensor:
        """[T] int64: row t + offset, held at its sequence's last row."""
        rows = torch.arange(self.seq_id.shape[0], device=self.seq_id.device)
        return torch.minimum(rows + offset, self.end - 1).clamp(min=0)


def unroll(
    head: torch.nn.Module,
    token_ids: torch.Tensor,
    hidden_states: torch.Tensor,
    positions: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    num_steps: int,
    tokens: str = "data",
    loop: str = "eagle",
    attention: str = "auto",
    return_logits: bool = True,
) -> UnrollOutput:
    """The K = num_steps draft steps of every chain start (module docstring).

    Differentiable with respect to the head's parameters and hidden_states wherever
    autograd is on (a training step); draft tokens never carry gradients (argmax).
    For evaluation call `unroll_for_eval`, which never records autograd state.
    attention: "auto" (the fused FlexAttention kernel for CUDA tensors under
    torch.compile, dense elsewhere), "dense" or "flex" (see
    specdraft.training.attention). Python ints and strings are static under
    torch.compile; K unrolls; there is no host sync.
    """
    check_choice("tokens", tokens, TOKEN_MODES)
    check_choice("loop", loop, LOOPS)
    check_choice("attention", attention, BACKENDS)
    check_int_range("num_steps", num_steps, 1)
    if not isinstance(return_logits, bool):
        raise ValueError(f"return_logits must be a bool, got {type(return_logits).__name__}")
    check_head(head, loop)
    check_tensor_arg("token_ids", token_ids, INDEX_DTYPES, rank=1)
    num_tokens = token_ids.shape[0]
    # The width the head reads (EAGLE-3: its three aux layers), else a matmul error deep inside.
    check_tensor_arg("hidden_states", hidden_states, rank=2, shape=(num_tokens, head.hidden_width), device_of=token_ids)
    check_tensor_arg("positions", positions, INDEX_DTYPES, shape=[(num_tokens,), (3, num_tokens)], device_of=token_ids)
    check_tensor_arg("cu_seqlens", cu_seqlens, INDEX_DTYPES, rank=1, device_of=token_ids)
    if cu_seqlens.shape[0] < 2:
        raise ValueError(f"cu_seqlens must hold S + 1 >= 2 entries, got {cu_seqlens.shape[0]}")
    layout = PackedLayout.from_cu_seqlens(cu_seqlens, num_tokens)
    # Ids outside the vocabulary (out of contract) must not index past the embedding.
    token_ids = token_ids.clamp(0, head.config.vocab_size - 1)
    run = eagle_chains if loop == "eagle" else multi_layer_chains
    steps = run(head, token_ids, head.combine_hidden_states(hidden_states), positions.long(), layout,
                num_steps=num_steps, tokens=tokens, attention=attention)  # fmt: skip
    hidden = torch.stack([s.hidden for s in steps])
    logits = torch.stack([s.logits for s in steps]) if return_logits else None
    draft_tokens = torch.stack([s.draft_tokens for s in steps])
    rows = torch.arange(num_tokens, device=token_ids.device)
    offsets = torch.arange(1, num_steps + 1, device=token_ids.device)[:, None]
    # Rows past cu_seqlens[-1] (padding) start no valid step.
    in_batch = layout.seq_id < cu_seqlens.shape[0] - 1
    valid = (rows[None, :] + offsets < layout.end[None, :]) & in_batch[None, :]
    return UnrollOutput(logits, hidden, draft_tokens, valid)


@torch.no_grad()
def unroll_for_eval(head, token_ids, hidden_states, positions, cu_seqlens, *, num_steps: int, tokens: str = "draft",
                    loop: str = "eagle", attention: str = "auto", return_logits: bool = True) -> UnrollOutput:  # fmt: skip
    """`unroll` for evaluation: draft tokens by default, and never differentiable,
    whatever the caller's grad mode: it records no autograd graph and returns no
    tensor that requires grad, so calling it (compiled) between optimizer steps
    neither keeps activations alive nor changes what a compiled graph was built for."""
    return unroll(
        head, token_ids, hidden_states, positions, cu_seqlens, num_steps=num_steps, tokens=tokens, loop=loop,
        attention=attention, return_logits=return_logits,
    )  # fmt: skip


# ---------------------------------------------------------------------------- the loops


def check_head(head: object, loop: str) -> None:
    """A head the unroll can run in `loop`; a ValueError naming `head` otherwise."""
    if not isinstance(head, DraftHead):
        raise ValueError(f"head must be an EagleHead, Eagle3Head or MTPHead, got {type(head).__name__}")
    if head.missing_weights:
        raise ValueError(
            f"head has no {', '.join(sorted(head.missing_weights))}: the checkpoint did not include them; "
            "call head.share_from(target) first"
        )
    head.check_loop(loop)


class DraftStep(NamedTuple):
    hidden: torch.Tensor  # [T, H] for sampling
    logits: torch.Tensor  # [T, V_draft]
    draft_tokens: torch.Tensor  # [T] int64, target vocabulary


def sample_step(head, hidden, step: int) -> DraftStep:
    """Step `step`'s logits and greedy drafts from its hidden state."""
    logits = head.draft_logits(hidden, step)
    return DraftStep(hidden, logits, head.draft_to_target(logits.detach().argmax(dim=-1)))


class ContextAttention:
    """The unroll's attention for a pass over every row, causal within each
    sequence (chain_attention with no diagonal). Keeps the pass's keys and values:
    the context that later steps of every chain see."""

    def __init__(self, layout: PackedLayout, backend: str) -> None:
        self.seq_id, self.backend = layout.seq_id, backend
        self.keys = self.values = None

    def __call__(self, q, k, v):
        self.keys, self.values = k, v
        return chain_attention(q[None], k, v, None, None, seq_id=self.seq_id, ctx_offset=0, diag_visible=None,
                               backend=self.backend)[0]  # fmt: skip


class ChainStepAttention:
    """EAGLE step k of every chain at once: the context pass's keys up to t and the
    chain's own steps 1 .. k (each call appends its step's keys)."""

    def __init__(self, context: ContextAttention) -> None:
        self.context = context
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def __call__(self, q, k, v):
        self.keys.append(k)
        self.values.append(v)
        c = self.context
        return chain_attention(
            q[None], c.keys, c.values, torch.stack(self.keys), torch.stack(self.values), seq_id=c.seq_id,
            ctx_offset=0, diag_visible=None, backend=c.backend,
        )[0]  # fmt: skip


class OwnRowsAttention:
    """Multi-layer pass k over the chains' own rows, blocks [k, T] laid out block
    major: the shared pass's keys up to t - k (context) and the chain's own blocks
    where diag_visible [k, k, T] says so."""

    def __init__(self, context: ContextAttention, num_blocks: int, diag_visible: torch.Tensor) -> None:
        self.context, self.num_blocks, self.diag_visible = context, num_blocks, diag_visible

    def __call__(self, q, k, v):
        c, blocks = self.context, self.num_blocks
        out = chain_attention(
            q.unflatten(0, (blocks, -1)), c.keys, c.values, k.unflatten(0, (blocks, -1)),
            v.unflatten(0, (blocks, -1)), seq_id=c.seq_id, ctx_offset=blocks, diag_visible=self.diag_visible,
            backend=c.backend,
        )  # fmt: skip
        return out.flatten(0, 1)


def whole_pass(head, step, input_ids, hidden, positions, layout, attention):
    """One pass of layer `step` over every row, causal within each sequence. Returns
    (hidden for sampling, hidden for the next step) and the pass's attention, which
    holds its keys and values."""
    context = ContextAttention(layout, attention)
    h_sample, h_next = head.step(input_ids, positions, hidden, step, context)
    return h_sample, h_next, context


def eagle_chains(head, token_ids, hidden, positions, layout: PackedLayout, *, num_steps, tokens, attention):
    """EAGLE's loop: the first pass, then K - 1 single-token steps of every chain."""
    h_sample, h_next, context = whole_pass(
        head, 0, token_ids.index_select(0, layout.shifted(1)), hidden, positions, layout, attention
    )
    steps = [sample_step(head, h_sample, 0)]
    chain = ChainStepAttention(context)
    for step in range(1, num_steps):
        if tokens == "draft":
            input_ids = steps[-1].draft_tokens
        else:
            input_ids = token_ids.index_select(0, layout.shifted(step + 1))
        h_sample, h_next = head.step(input_ids, positions + step, h_next, step, chain)
        steps.append(sample_step(head, h_sample, step))
    return steps


def multi_layer_chains(head, token_ids, hidden, positions, layout: PackedLayout, *, num_steps, tokens, attention):
    """Multi-layer EAGLE: pass k over the window with ids shifted by k + 1.

    Shared rows (data ids, every row) are one whole pass per step. In draft mode chain
    t also has its own rows r = t - j, j = 0 .. k - 1, as blocks [k, T]: block j reads
    the chain's draft k - 1 - j and, at pass k - 1, its own block j (j < k - 1) or the
    shared row t - k + 1 (j = k - 1); it attends to the shared rows <= t - k of its
    sequence and to its chain's blocks j' >= j (rows t - j' <= t - j) that lie in the
    sequence. Draft k is block 0's."""
    num_tokens = token_ids.shape[0]
    rows = torch.arange(num_tokens, device=token_ids.device)
    shared_sample, shared_next, _ = whole_pass(
        head, 0, token_ids.index_select(0, layout.shifted(1)), hidden, positions, layout, attention
    )
    steps = [sample_step(head, shared_sample, 0)]
    own_next = None  # [k - 1, T, H]: the chain's own rows at the previous pass
    for step in range(1, num_steps):
        shared_ids = token_ids.index_select(0, layout.shifted(step + 1))
        shared_sample, next_shared, context = whole_pass(head, step, shared_ids, shared_next, positions, layout,
                                                         attention)  # fmt: skip
        if tokens == "data":
            steps.append(sample_step(head, shared_sample, step))
            shared_next = next_shared
            continue
        offset = torch.arange(step, device=rows.device)[:, None]  # j
        own_row = rows[None, :] - offset  # [k, T]
        in_sequence = own_row >= layout.start[None, :]
        own_row = own_row.clamp(min=0)
        own_ids = torch.stack([steps[step - 1 - j].draft_tokens for j in range(step)])
        entering = shared_next.index_select(0, own_row[step - 1])[None]  # the shared row t - k + 1
        own_hidden = entering if own_next is None else torch.cat([own_next, entering])
        own_positions = position_rows(positions, own_row).reshape(*positions.shape[:-1], -1)
        # Block j sees block j (itself, so no row sees nothing) and blocks j' > j in the sequence.
        later = offset[None, :, :] > offset[:, None, :]  # [k, k, 1]: j' > j
        same = offset[None, :, :] == offset[:, None, :]
        own = OwnRowsAttention(context, step, same | (later & in_sequence[None, :, :]))
        own_sample, own_out = head.step(own_ids.reshape(-1), own_positions, own_hidden.reshape(step * num_tokens, -1),
                                        step, own)  # fmt: skip
        steps.append(sample_step(head, own_sample.view(step, num_tokens, -1)[0], step))
        own_next = own_out.view(step, num_tokens, -1)
        shared_next = next_shared
    return steps
