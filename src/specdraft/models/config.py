"""The draft model's own configuration.

A draft can differ from its target (dtype, vocabulary, hidden size: an EAGLE-3 head
for a 70B target is one layer of the target's width, but its vocabulary may be a 32k
subset), so it gets its own dataclass, built from the draft checkpoint's config.json.
Every check raises a ValueError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


@dataclass(frozen=True)
class DraftModelConfig:
    """Shapes and constants of a Llama-style draft head (or of the tiny target model).

    head_dim defaults to hidden_size // num_heads, draft_vocab_size to vocab_size,
    target_hidden_size (width of the target's hidden states; EAGLE-3 fuses three of
    them) to hidden_size. mrope_section, when set, splits the head_dim // 2 rotary
    frequencies into sections driven by the t / h / w rows of [3, T] positions.
    n_predict is the number of MTP layers; num_layers the decoder depth of the tiny
    target model (draft heads have one layer per predictor).
    """

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    head_dim: int | None = None
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    mrope_section: tuple[int, ...] | None = None
    n_predict: int = 1
    num_layers: int = 1
    attention_bias: bool = False
    dtype: torch.dtype = torch.float32
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "vocab_size"):
            _positive_int(name, getattr(self, name))
        for name in ("n_predict", "num_layers"):
            _positive_int(name, getattr(self, name))
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"head_dim: hidden_size ({self.hidden_size}) is not divisible by num_heads "
                    f"({self.num_heads}); give head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _positive_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads}) for grouped-query attention"
            )
        if self.draft_vocab_size is None:
            object.__setattr__(self, "draft_vocab_size", self.vocab_size)
        _positive_int("draft_vocab_size", self.draft_vocab_size)
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"draft_vocab_size ({self.draft_vocab_size}) must not exceed vocab_size ({self.vocab_size})"
            )
        if self.target_hidden_size is None:
            object.__setattr__(self, "target_hidden_size", self.hidden_size)
        _positive_int("target_hidden_size", self.target_hidden_size)
        if not (isinstance(self.rms_norm_eps, int | float) and self.rms_norm_eps > 0):
            raise ValueError(f"rms_norm_eps must be a positive number, got {self.rms_norm_eps!r}")
        if not (isinstance(self.rope_theta, int | float) and self.rope_theta > 0):
            raise ValueError(f"rope_theta must be a positive number, got {self.rope_theta!r}")
        self._check_mrope_section()
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch.dtype, got {self.dtype!r}")

    def _check_mrope_section(self) -> None:
        if self.mrope_section is None:
            return
        section = tuple(self.mrope_section)
        if len(section) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in section):
            raise ValueError(f"mrope_section must be three non-negative ints (t, h, w), got {self.mrope_section!r}")
        if sum(section) != self.head_dim // 2:
            raise ValueError(
                f"mrope_section must sum to head_dim // 2 = {self.head_dim // 2}, got {section} (sum {sum(section)})"
            )
        object.__setattr__(self, "mrope_section", section)

    @property
    def uses_mrope(self) -> bool:
        return self.mrope_section is not None

    def with_dtype(self, dtype: torch.dtype) -> DraftModelConfig:
        return replace(self, dtype=dtype)

    def to_hf_config(self) -> dict[str, Any]:
        """The config.json dict from_hf_config reads back (used by save_draft_model)."""
        out = {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "num_nextn_predict_layers": self.n_predict,
            "num_hidden_layers": self.num_layers,
            "attention_bias": self.attention_bias,
            "torch_dtype": str(self.dtype).removeprefix("torch."),
            **self.extra,
        }
        if self.mrope_section is not None:
            out["rope_scaling"] = {"type": "mrope", "mrope_section": list(self.mrope_section)}
        return out

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], dtype: torch.dtype | None = None) -> DraftModelConfig:
        """Build from a Hugging Face config.json dict (Llama / Qwen2(-VL) / EAGLE /
        EAGLE-3 / DeepSeek-MTP keys). `dtype` overrides the checkpoint's torch_dtype."""
        if not isinstance(hf, dict):
            raise ValueError(f"hf config must be a dict, got {type(hf).__name__}")
        # Some EAGLE-1 configs nest the draft's shapes under "model".
        if "hidden_size" not in hf and isinstance(hf.get("model"), dict):
            hf = {**hf["model"], **{k: v for k, v in hf.items() if k != "model"}}
        for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
            if key not in hf:
                raise ValueError(f"{key}: missing from the HF config")
        rope_scaling = hf.get("rope_scaling") or {}
        rope_params = hf.get("rope_parameters") or {}
        return cls(
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim"),
            vocab_size=hf["vocab_size"],
            draft_vocab_size=hf.get("draft_vocab_size"),
            target_hidden_size=hf.get("target_hidden_size"),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=hf.get("rope_theta", rope_params.get("rope_theta", 10000.0)),
            mrope_section=_mrope_section_of(rope_scaling, rope_params),
            n_predict=hf.get("n_predict") or hf.get("num_nextn_predict_layers") or 1,
            num_layers=hf.get("num_hidden_layers") or 1,
            attention_bias=bool(hf.get("attention_bias", False)),
            dtype=dtype if dtype is not None else _dtype_of(hf.get("torch_dtype", hf.get("dtype"))),
            extra={k: hf[k] for k in ("eagle_config", "architectures") if k in hf},
        )


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _mrope_section_of(rope_scaling: dict, rope_params: dict) -> tuple[int, ...] | None:
    for source in (rope_scaling, rope_params):
        if source.get("mrope_section") is not None:
            return tuple(source["mrope_section"])
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind not in ("default", "mrope"):
        # Scaled RoPE variants change the frequencies; silently ignoring them would
        # give a draft that runs but proposes garbage.
        raise ValueError(f"rope_scaling: type {kind!r} is not supported (only default RoPE and mrope)")
    return None


def _dtype_of(name: object) -> torch.dtype:
    if name is None:
        return torch.float32
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ValueError(f"torch_dtype: unsupported value {name!r} (one of {sorted(_DTYPES)})")
    return _DTYPES[name]
