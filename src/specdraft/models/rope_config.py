"""RoPE settings from a Hugging Face config.json, in both of its spellings:
transformers 4's `rope_scaling` ({"type" or "rope_type": ..., "factor": ...}, with
rope_theta at the top level) and transformers 5's `rope_parameters` (the same keys
plus rope_theta, under "rope_type"). Defaults are filled in as transformers does:
original_max_position_embeddings from the top-level key of that name (which wins, as
for Phi-3), else from the dict, else max_position_embeddings; YaRN's factor from
max_position_embeddings / original_max_position_embeddings when null; beta_fast 32,
beta_slow 1, truncate true; attention_factor from factor (and mscale /
mscale_all_dim when both are set).

Every key that would change the rotation is used or refused: an unknown RoPE type, a
key the type does not define, partial rotary embeddings, and the two spellings
disagreeing are each a ValueError naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specdraft.models.rope import DYNAMIC_NTK_REFUSAL, RopeScaling

# Keys every RoPE dict may carry; the per-type keys below add to them.
_COMMON_KEYS = {"type", "rope_type", "rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved"}
_TYPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
}


@dataclass(frozen=True)
class RopeSettings:
    theta: float
    scaling: RopeScaling | None
    mrope_section: tuple[int, ...] | None
    mrope_interleaved: bool


def rope_from_hf(hf: dict[str, Any], default_theta: float = 10000.0) -> RopeSettings:
    """The RoPE of a config.json dict; ValueError naming the key for what is not
    implemented."""
    key, rope = _rope_dict(hf)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "mrope":  # transformers 4's name for Qwen2-VL's default-frequency M-RoPE
        kind = "default"
    if kind == "dynamic":
        raise ValueError(f"{key}: {DYNAMIC_NTK_REFUSAL}")
    if kind not in _TYPE_KEYS:
        raise ValueError(f"{key}: rope type {kind!r} is not supported (one of {sorted(_TYPE_KEYS)})")
    unknown = sorted(set(rope) - _COMMON_KEYS - _TYPE_KEYS[kind])
    if unknown:
        raise ValueError(f"{key}: {unknown} not understood for rope type {kind!r}")
    for where, value in (
        (key, rope.get("partial_rotary_factor")),
        ("partial_rotary_factor", hf.get("partial_rotary_factor")),
    ):
        if value is not None and value != 1.0:
            raise ValueError(f"{where}: partial_rotary_factor {value!r} is not supported (only 1.0)")
    theta = rope.get("rope_theta", hf.get("rope_theta", default_theta))
    if (
        hf.get("rope_theta") is not None
        and rope.get("rope_theta") is not None
        and hf["rope_theta"] != rope["rope_theta"]
    ):
        raise ValueError(f"rope_theta: {hf['rope_theta']!r} at the top level but {rope['rope_theta']!r} in {key}")
    section = rope.get("mrope_section")
    interleaved = rope.get("mrope_interleaved", hf.get("mrope_interleaved", False))
    if not isinstance(interleaved, bool):
        raise ValueError(f"mrope_interleaved: expected true or false, got {interleaved!r}")
    if interleaved and section is None:
        raise ValueError("mrope_interleaved: true, but no mrope_section says how many frequencies each row drives")
    scaling = None if kind == "default" else _scaling(key, kind, rope, hf)
    return RopeSettings(
        theta=theta,
        scaling=scaling,
        mrope_section=None if section is None else tuple(section),
        mrope_interleaved=interleaved,
    )


def _rope_dict(hf: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(the key it came from, the RoPE dict); {} when neither spelling is set."""
    found = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = hf.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ValueError(f"{key}: expected a dict or null, got {value!r}")
        if value:
            found[key] = value
    if len(found) == 2 and _normalised(found["rope_scaling"]) != _normalised(found["rope_parameters"]):
        raise ValueError(
            f"rope_scaling and rope_parameters disagree ({found['rope_scaling']!r} vs {found['rope_parameters']!r}); "
            "transformers 4 reads one and transformers 5 the other"
        )
    if not found:
        return "rope_scaling", {}
    key = "rope_parameters" if "rope_parameters" in found else "rope_scaling"
    return key, found[key]


def _normalised(rope: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in rope.items() if k not in ("type", "rope_type", "rope_theta")}
    kind = rope.get("rope_type", rope.get("type", "default"))
    out["rope_type"] = "default" if kind == "mrope" else kind
    return out


def _scaling(key: str, kind: str, rope: dict[str, Any], hf: dict[str, Any]) -> RopeScaling:
    def need(name: str) -> Any:
        if rope.get(name) is None:
            raise ValueError(f"{key}: {kind} RoPE needs {name!r}")
        return rope[name]

    if kind == "linear":
        return _checked(key, lambda: RopeScaling(kind, factor=need("factor")))
    original = hf.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
    original = original or hf.get("max_position_embeddings")
    if original is None:
        raise ValueError(f"{key}: {kind} RoPE needs original_max_position_embeddings (or max_position_embeddings)")
    if kind == "llama3":
        return _checked(
            key,
            lambda: RopeScaling(
                kind,
                factor=need("factor"),
                original_max_position_embeddings=original,
                low_freq_factor=need("low_freq_factor"),
                high_freq_factor=need("high_freq_factor"),
            ),
        )
    factor = rope.get("factor")
    if factor is None:
        if hf.get("max_position_embeddings") is None:
            raise ValueError(f"{key}: yarn RoPE needs 'factor' (or max_position_embeddings to derive it)")
        factor = hf["max_position_embeddings"] / original
    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ValueError(f"{key}: truncate must be true or false, got {truncate!r}")
    return _checked(
        key,
        lambda: RopeScaling(
            kind,
            factor=factor,
            original_max_position_embeddings=original,
            beta_fast=rope.get("beta_fast") or 32.0,
            beta_slow=rope.get("beta_slow") or 1.0,
            truncate=truncate,
            attention_factor=float(attention_factor),
        ),
    )


def _checked(key: str, build) -> RopeScaling:
    try:
        return build()
    except ValueError as e:
        raise ValueError(f"{key}: {e}") from None


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature: 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_to_hf(
    scaling: RopeScaling | None, mrope_section: tuple[int, ...] | None, mrope_interleaved: bool
) -> dict[str, Any] | None:
    """The transformers-4 `rope_scaling` dict rope_from_hf reads back to the same
    settings (transformers 5 reads this spelling too); None for plain RoPE."""
    out: dict[str, Any] = {}
    if scaling is not None:
        out = {"rope_type": scaling.rope_type, "factor": scaling.factor}
        if scaling.rope_type == "llama3":
            out |= {"low_freq_factor": scaling.low_freq_factor, "high_freq_factor": scaling.high_freq_factor}
        if scaling.rope_type in ("llama3", "yarn"):
            out["original_max_position_embeddings"] = scaling.original_max_position_embeddings
        if scaling.rope_type == "yarn":
            out |= {
                "beta_fast": scaling.beta_fast,
                "beta_slow": scaling.beta_slow,
                "truncate": scaling.truncate,
                "attention_factor": scaling.attention_factor,
            }
    if mrope_section is not None:
        # transformers 4 names Qwen2-VL's default-frequency M-RoPE "mrope"; Qwen3-VL's
        # interleaved one keeps "default".
        out = out or ({"rope_type": "default"} if mrope_interleaved else {"type": "mrope"})
        out["mrope_section"] = list(mrope_section)
        if mrope_interleaved:
            out["mrope_interleaved"] = True
    return out or None
