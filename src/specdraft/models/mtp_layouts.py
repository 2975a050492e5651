"""MTP checkpoint layouts: mapped to MTPHead's names, or refused with a ValueError
naming what MTPHead does not compute. Names below are after a leading "model.".

MTPHead computes DeepSeek-V3's MTP module (vLLM deepseek_mtp.py) with a dense
Llama-style decoder layer: h = layer(eh_proj([enorm(emb); hnorm(hidden)])), logits
= head(shared_head.norm(h)), and h (not normalised) is what the next draft step
receives; the embedding is zeroed at position 0.

- DeepSeek-V3 / GLM-4.5 layout, `layers.{N + k}.{enorm, hnorm, eh_proj,
  shared_head.norm, shared_head.head, embed_tokens, self_attn.*, mlp.*, ...}` with N
  = num_hidden_layers (the target's depth; numbered from 0 in this package's own
  saves): loads, renumbered to layers.{k}, when the layer is dense Llama-style.
  Refused by tensor name: MoE MLPs (mlp.experts / mlp.gate / shared experts:
  DeepSeek-V3's and GLM-4.5's MTP layers are MoE), DeepSeek's MLA attention
  (q_a_proj, kv_a_proj_with_mqa, kv_b_proj), gated attention (g_proj), quantization
  scales.
- Step-3.5 (model_type step3p5; several MTP layers, each with its own
  shared_head.output): refused, its RMSNorms are zero-centred (the scale is 1 +
  weight), its attention has head-wise gates and its MLPs are MoE.
- Qwen3-Next / Qwen3.5 (`mtp.fc`, `mtp.pre_fc_norm_*`, `mtp.layers.{k}`,
  `mtp.norm`): refused, zero-centred RMSNorms, gated attention (q_proj also emits
  the gate), and the next step receives mtp.norm(h), not h.
- MiMo (`mtp_layers.{k}.{token_layernorm, hidden_layernorm, input_proj,
  final_layernorm, ...}`, vLLM mimo_mtp.py): loads as token_layernorm = enorm,
  hidden_layernorm = hnorm, input_proj over [hidden; emb] = eh_proj over [emb;
  hidden] (its two column blocks swapped), final_layernorm = shared_head.norm before
  the target's lm_head; its layers are Qwen2's (q / k / v biases) and the next step
  receives final_layernorm(h) (config hidden_feed "normed"). From a full MiMo
  folder the target's own layers and final norm are left out.
"""

from __future__ import annotations

import re

import torch

_LAYER = re.compile(r"^layers\.(\d+)\.(.*)$")

# Substrings of a tensor name inside an MTP layer -> what they are.
UNSUPPORTED_PARTS = {
    ".mlp.experts.": "a MoE MLP",
    ".mlp.gate.": "a MoE router (mlp.gate)",
    ".mlp.shared_expert": "a MoE shared expert",
    ".moe.": "a MoE MLP",
    ".block_sparse_moe.": "a MoE MLP",
    ".self_attn.q_a_proj.": "DeepSeek's MLA attention",
    ".self_attn.kv_a_proj_with_mqa.": "DeepSeek's MLA attention",
    ".self_attn.kv_b_proj.": "DeepSeek's MLA attention",
    ".self_attn.g_proj.": "a gated attention output (g_proj)",
    ".shared_head.output.": "Step-3.5's MTP layout",
    "_scale": "a quantized weight (its scale tensor)",
}
ZERO_CENTRED = "zero-centred RMSNorms (scale = 1 + weight)"
REFUSED_FAMILIES = {
    "step3p5": f"Step-3.5's MTP layers: {ZERO_CENTRED}, head-wise attention gates and MoE MLPs",
    "qwen3_next": f"Qwen3-Next's MTP layout: {ZERO_CENTRED}, gated attention, mtp.norm(h) fed to the next step",
    "qwen3_5": f"Qwen3.5's MTP layout: {ZERO_CENTRED}, gated attention, mtp.norm(h) fed to the next step",
}


def looks_like_mtp(names: set[str]) -> bool:
    """Whether (prefix-stripped) tensor names are those of an MTP layout."""
    return any(
        (n.startswith("layers.") and n.endswith(".enorm.weight"))
        or n.startswith("mtp.")
        or (n.startswith("mtp_layers.") and n.endswith(".token_layernorm.weight"))
        for n in names
    )


def model_type_of(hf: dict) -> str:
    text = hf.get("text_config") if isinstance(hf.get("text_config"), dict) else {}
    return str(hf.get("model_type") or text.get("model_type") or "")


def normalise_mtp(tensors: dict[str, torch.Tensor], hf: dict) -> dict[str, torch.Tensor]:
    """Prefix-stripped checkpoint names -> MTPHead's (see the module docstring), or a
    ValueError naming what is not supported."""
    model_type = model_type_of(hf)
    for family, reason in REFUSED_FAMILIES.items():
        if model_type.startswith(family):
            raise ValueError(f"model_type: {model_type!r} is not supported as an MTP draft ({reason})")
    names = set(tensors)
    if any(n.startswith("mtp.") for n in names):
        raise ValueError(f"tensors 'mtp.*': {REFUSED_FAMILIES['qwen3_next']} are not supported")
    if any(n.startswith("mtp_layers.") for n in names):
        return mimo_to_deepseek(tensors)
    return renumber_deepseek_layers(tensors, hf)


def config_updates(names: set[str]) -> tuple[dict[str, object], dict[str, tuple[str, object]]]:
    """(config.json keys a layout implies, the DraftModelConfig fields they must set:
    field -> (what asks for it, value)), from prefix-stripped tensor names. MiMo's
    layers are Qwen2's (q / k / v biases, none on o_proj) and hand the next step
    final_layernorm(h) (hidden_feed "normed")."""
    if any(n.startswith("mtp_layers.") for n in names):
        why = "model.mtp_layers (MiMo's MTP layout)"
        updates = {"qkv_bias": True, "o_proj_bias": False, "hidden_feed": "normed"}
        return updates, {"attention_bias": (why, True), "hidden_feed": (why, "normed")}
    return {}, {}


_MIMO = re.compile(r"^mtp_layers\.(\d+)\.(.*)$")
MIMO_NAMES = {
    "token_layernorm.weight": "enorm.weight",
    "hidden_layernorm.weight": "hnorm.weight",
    "final_layernorm.weight": "shared_head.norm.weight",
}


def mimo_to_deepseek(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MiMo's mtp_layers.{k}.* -> layers.{k}.* under MTPHead's names. input_proj
    reads [hidden; emb] and eh_proj [emb; hidden], so its two column blocks swap. A
    full MiMo folder also holds the target: its layers.* and final norm.weight are
    not the MTP head's and are left out (as vLLM's MiMoMTP does); the target's
    embed_tokens and lm_head are the head's."""
    out: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        m = _MIMO.match(name)
        if m is None:
            if not (name.startswith("layers.") or name == "norm.weight"):
                out[name] = value
            continue
        layer, part = m.group(1), m.group(2)
        for piece, what in UNSUPPORTED_PARTS.items():
            if piece in "." + part:
                raise ValueError(f"tensor {name!r}: {what} in an MTP layer is not supported")
        if part == "input_proj.weight":
            hidden_cols, emb_cols = value.chunk(2, dim=1)
            out[f"layers.{layer}.eh_proj.weight"] = torch.cat([emb_cols, hidden_cols], dim=1)
        else:
            out[f"layers.{layer}.{MIMO_NAMES.get(part, part)}"] = value
    return out


def renumber_deepseek_layers(tensors: dict[str, torch.Tensor], hf: dict) -> dict[str, torch.Tensor]:
    """layers.{first + k}.* of the MTP layers (those with an enorm) -> layers.{k}.*;
    their per-layer embed_tokens copies -> embed_tokens. Other names are kept (and
    are unexpected tensors if MTPHead has no such module)."""
    ids = sorted({int(m.group(1)) for k in tensors if (m := _LAYER.match(k)) and m.group(2) == "enorm.weight"})
    if not ids:
        raise ValueError("method: 'mtp' needs layers.{i}.enorm.weight tensors (DeepSeek's MTP layout)")
    first = ids[0]
    target_depth = hf.get("num_hidden_layers")
    starts = (first,) if target_depth is None else (0, target_depth)
    if ids != list(range(first, first + len(ids))) or first not in starts:
        raise ValueError(
            f"num_hidden_layers: the MTP layers are layers {ids}; they must be numbered from 0 or from "
            f"num_hidden_layers ({target_depth}) on, without gaps"
        )
    out: dict[str, torch.Tensor] = {}
    embeds: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        m = _LAYER.match(name)
        if m is None or int(m.group(1)) not in ids:
            out[name] = value
            continue
        for part, what in UNSUPPORTED_PARTS.items():
            if part in "." + m.group(2):
                raise ValueError(f"tensor {name!r}: {what} in an MTP layer is not supported")
        if m.group(2) == "embed_tokens.weight":  # DeepSeek stores a copy per MTP layer
            embeds[name] = value
        else:
            out[f"layers.{int(m.group(1)) - first}.{m.group(2)}"] = value
    if "embed_tokens.weight" in out:
        embeds["embed_tokens.weight"] = out["embed_tokens.weight"]
    if embeds:
        (name0, embed), *others = sorted(embeds.items())
        for name, value in others:
            if value.shape != embed.shape or not torch.equal(value, embed):
                raise ValueError(f"tensors {name0!r} and {name!r}: the MTP layers' embedding copies differ")
        out["embed_tokens.weight"] = embed
    return out
