"""One draft step of a serving head, split around its attention.

The heads in specdraft.models.heads run attention through a paged KV cache, which
serves one request window at a time. The unroll attends over every chain of a
packed batch at once (specdraft.training.attention), so it calls the head's layer in
three parts, built from the head's own public submodules (the same weights, the same
norms, projections, RoPE and MLP as `forward`):

    layer_input   ids, hidden -> (the attention input, the residual)   per head kind
    project       q, k, v with RoPE / M-RoPE (the layer's SelfAttention)
    finish        o_proj, residual, post-attention norm, MLP

and `outputs` / `draft_logits` as the head's forward / compute_logits do. That the
composition equals the head's forward is not assumed: the unroll's tests compare it
with what `EagleProposer.propose` and `MultiLayerEagleProposer.propose` draft.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdraft.models.heads import Eagle3Head, EagleHead, MTPHead

HEAD_TYPES = (EagleHead, Eagle3Head, MTPHead)


def check_head(head: object, loop: str) -> None:
    """A head the unroll can run in `loop`; a ValueError naming `head` otherwise."""
    if not isinstance(head, HEAD_TYPES):
        raise ValueError(f"head must be an EagleHead, Eagle3Head or MTPHead, got {type(head).__name__}")
    if head.missing_weights:
        raise ValueError(
            f"head has no {', '.join(sorted(head.missing_weights))}: the checkpoint did not include them; "
            "call head.share_from(target) first"
        )
    if loop == "multi_layer" and not isinstance(head, MTPHead):
        raise ValueError(f"head must be an MTPHead for loop='multi_layer', got {type(head).__name__}")
    if loop == "eagle" and isinstance(head, MTPHead) and head.config.n_predict > 1:
        # In EAGLE's loop draft step k runs layer k % n_predict against that layer's own
        # KV cache, which the first pass (layer 0) never fills: there is no context a
        # training unroll could reproduce. Such heads draft with the multi-layer loop.
        raise ValueError(
            f"head is an MTPHead with n_predict = {head.config.n_predict}: use loop='multi_layer' "
            "(EAGLE's loop needs n_predict = 1)"
        )


def layer_of(head, step: int):
    """The decoder layer draft step `step` runs."""
    if isinstance(head, MTPHead):
        return head.layers[head.layer_index(step)]
    if isinstance(head, Eagle3Head):
        return head.midlayer
    return head.layers[0]


def layer_input(head, layer, input_ids, hidden, positions) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention input, residual) of one step's rows, as the head's forward builds them."""
    emb = head.embed_input_ids(input_ids)
    hidden = hidden.to(emb.dtype)
    if isinstance(head, Eagle3Head):
        normed_hidden = layer.hidden_norm(hidden)
        residual = normed_hidden if getattr(layer, "norm_before_residual", False) else hidden
        return torch.cat([layer.input_layernorm(emb), normed_hidden], dim=-1), residual
    if isinstance(head, MTPHead):
        if head.mask_position_zero:
            pos = positions if positions.dim() == 1 else positions[0]
            emb = torch.where((pos == 0)[:, None], 0, emb)
        x = layer.eh_proj(torch.cat([layer.enorm(emb), layer.hnorm(hidden)], dim=-1))
    else:
        x = head.fc(torch.cat([emb, hidden], dim=-1))
    return (x if layer.input_layernorm is None else layer.input_layernorm(x)), x


def project(layer, attn_input, positions) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [N, heads, D], k and v [N, kv_heads, D], RoPE applied at `positions`."""
    attn = layer.self_attn
    n = attn_input.shape[0]
    q = attn.q_proj(attn_input).view(n, attn.num_heads, attn.head_dim)
    k = attn.k_proj(attn_input).view(n, attn.num_kv_heads, attn.head_dim)
    v = attn.v_proj(attn_input).view(n, attn.num_kv_heads, attn.head_dim)
    if getattr(attn, "q_norm", None) is not None:  # Qwen3's per-head norm, before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = attn.rotary(positions, q, k)
    return q, k, v


def finish(layer, attn_out, residual) -> torch.Tensor:
    """attn_out [N, heads, D] -> the layer's output [N, H]."""
    attn = layer.self_attn
    h = residual + attn.o_proj(attn_out.reshape(attn_out.shape[0], attn.num_heads * attn.head_dim))
    return h + swiglu(layer.mlp, layer.post_attention_layernorm(h))


def swiglu(mlp, x) -> torch.Tensor:
    """SwiGLU.forward, from its projections. Not `mlp(x)`: that method is a nested
    compile region, and with torch 2.13's Inductor a region called more than once in
    a graph that is differentiated (the unroll calls it once per step) can return
    wrong weight gradients for gate_proj and up_proj (down_proj's stay right;
    aot_eager and eager are right)."""
    return mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))


def outputs(head, layer, h) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden for sampling, hidden for the next step), as the head's forward returns:
    config.hidden_feed "normed" hands the next step the final norm's output."""
    normed_feed = getattr(head.config, "hidden_feed", "prenorm") == "normed"
    if isinstance(head, MTPHead):
        h = layer.shared_head.norm(h) if normed_feed else h
        return h, h
    if head.norm is None or not getattr(head.config, "logits_norm", True):
        return h, h
    normed = head.norm(h)
    return normed, (normed if normed_feed else h)


def draft_logits(head, hidden, step: int) -> torch.Tensor:
    """Logits over the head's draft vocabulary: EAGLE-3's lm_head over its draft ids
    (map to target ids with `target_token_ids`), the target vocabulary otherwise."""
    if isinstance(head, Eagle3Head):
        return head.compute_draft_logits(hidden)
    return head.compute_logits(hidden, spec_step_idx=step)


def target_token_ids(head, draft_ids: torch.Tensor) -> torch.Tensor:
    """Target-vocabulary ids of draft-vocabulary ids, as compute_logits places them
    (EAGLE-3 maps through d2t only when its draft vocabulary is smaller)."""
    draft_ids = draft_ids.to(torch.int64)
    if isinstance(head, Eagle3Head) and head.config.draft_vocab_size != head.config.vocab_size:
        return head.map_draft_to_target(draft_ids)
    return draft_ids


def draft_vocab_size(head) -> int:
    return head.config.draft_vocab_size if isinstance(head, Eagle3Head) else head.config.vocab_size
