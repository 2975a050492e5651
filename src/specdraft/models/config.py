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

from specdraft.models.rope import RopeScaling, mrope_rows
from specdraft.models.rope_config import rope_from_hf, rope_to_hf

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}
HIDDEN_FEEDS = ("prenorm", "normed")
_FLAGS = (
    "attention_bias",
    "mrope_interleaved",
    "o_proj_bias",
    "qk_norm",
    "norm_before_residual",
    "fc_norm",
    "norm_before_fc",
    "logits_norm",
)
# Qwen2's attention has q / k / v biases and never an o_proj bias.
_QKV_BIAS_ONLY_TYPES = ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")
# Qwen3-style attention: per-head RMSNorm on q and k before RoPE.
_QK_NORM_TYPES = ("qwen3", "qwen3_moe")


@dataclass(frozen=True)
class DraftModelConfig:
    """Shapes and constants of a Llama-style draft head (or of the tiny target model).

    head_dim defaults to hidden_size // num_heads, draft_vocab_size to vocab_size,
    target_hidden_size (width of the target's hidden states; EAGLE-3 fuses three of
    them) to hidden_size. mrope_section, when set, splits the head_dim // 2 rotary
    frequencies into sections driven by the t / h / w rows of [3, T] positions
    (contiguous sections as in Qwen2-VL, or Qwen3-VL's t h w cycle when
    mrope_interleaved). rope_scaling: a scaled RoPE (specdraft.models.rope). n_predict
    is the number of MTP layers; num_layers the decoder depth of the tiny target
    model (draft heads have one layer per predictor).

    Attention variants: attention_bias puts biases on q / k / v, o_proj_bias on the
    output projection (Llama's attention_bias sets both; EAGLE-1's qkv_bias and
    Qwen2 only the first); qk_norm is Qwen3's per-head RMSNorm of q and k before RoPE
    (weights self_attn.q_norm / k_norm, [head_dim]).

    EAGLE-3 variants: norm_before_residual (vLLM / speculators: the midlayer's
    residual is hidden_norm(hidden), not hidden); fc_norm (SpecForge / speculators
    EAGLE-3.1: an RMSNorm on each of the three aux hidden states before fc, weights
    fc_norm.{0,1,2}) or norm_before_fc (speculators: one RMSNorm over the
    concatenated 3 * target_hidden_size, weight input_norm); logits_norm=False
    (SpecForge's norm_output: false) drops the final norm before lm_head.

    hidden_feed is what a head hands the next draft step as its hidden state:
    "prenorm" (the residual stream; EAGLE, EAGLE-3 in vLLM / SpecForge / the EAGLE
    repository, DeepSeek MTP) or "normed" (after the final norm, which then also
    feeds lm_head: speculators' norm_output: true, MiMo-style MTP).
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
    rope_scaling: RopeScaling | None = None
    mrope_interleaved: bool = False
    o_proj_bias: bool = False
    qk_norm: bool = False
    norm_before_residual: bool = False
    fc_norm: bool = False
    norm_before_fc: bool = False
    logits_norm: bool = True
    hidden_feed: str = "prenorm"
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
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError(f"rope_scaling must be a RopeScaling or None, got {self.rope_scaling!r}")
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.mrope_interleaved and self.mrope_section is None:
            raise ValueError("mrope_interleaved: needs an mrope_section")
        if self.mrope_interleaved:
            mrope_rows(self.mrope_section, interleaved=True)  # a ValueError naming mrope_section if it cannot
        if self.fc_norm and self.norm_before_fc:
            raise ValueError("fc_norm and norm_before_fc are two different norms before fc; set at most one")
        if self.hidden_feed not in HIDDEN_FEEDS:
            raise ValueError(f"hidden_feed must be one of {HIDDEN_FEEDS}, got {self.hidden_feed!r}")
        if self.hidden_feed == "normed" and not self.logits_norm:
            raise ValueError("hidden_feed: 'normed' feeds the final norm's output, but logits_norm=False has none")

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
        """The config.json dict from_hf_config reads back (used by save_draft_model).
        Biases are written the way vLLM and the EAGLE code read them: attention_bias
        for the output projection (and q / k / v), qkv_bias when q / k / v differ."""
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
            "attention_bias": self.o_proj_bias,
            "torch_dtype": str(self.dtype).removeprefix("torch."),
            **self.extra,
        }
        if self.attention_bias != self.o_proj_bias:
            out["qkv_bias"] = self.attention_bias
        rope = rope_to_hf(self.rope_scaling, self.mrope_section, self.mrope_interleaved)
        if rope is not None:
            out["rope_scaling"] = rope
        for name in ("qk_norm", "norm_before_residual", "fc_norm", "norm_before_fc"):
            if getattr(self, name):
                out[name] = True
        if not self.logits_norm:
            out["norm_output"] = False  # SpecForge's key
        if self.hidden_feed != "prenorm":
            out["hidden_feed"] = self.hidden_feed
        return out

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any], dtype: torch.dtype | None = None) -> DraftModelConfig:
        """Build from a Hugging Face config.json dict (Llama / Qwen2(-VL) / Qwen3(-VL) /
        EAGLE / EAGLE-3 / SpecForge / DeepSeek-MTP keys; RoPE in either of
        transformers' spellings, see specdraft.models.rope_config). `dtype` overrides
        the checkpoint's torch_dtype. A key whose math is not implemented is a
        ValueError naming it.

        norm_output means two things: in SpecForge's configs, false drops the final
        norm before lm_head (logits_norm); in the speculators format (a config with
        speculators_model_type), true feeds the normed hidden state to the next step
        (hidden_feed "normed"). specdraft's own hidden_feed key wins over both."""
        if not isinstance(hf, dict):
            raise ValueError(f"hf config must be a dict, got {type(hf).__name__}")
        # Some EAGLE-1 configs nest the draft's shapes under "model".
        if "hidden_size" not in hf and isinstance(hf.get("model"), dict):
            hf = {**hf["model"], **{k: v for k, v in hf.items() if k != "model"}}
        for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
            if key not in hf:
                raise ValueError(f"{key}: missing from the HF config")
        rope = rope_from_hf(hf)
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
            rope_theta=rope.theta,
            mrope_section=rope.mrope_section,
            rope_scaling=rope.scaling,
            mrope_interleaved=rope.mrope_interleaved,
            n_predict=hf.get("n_predict") or hf.get("num_nextn_predict_layers") or 1,
            num_layers=hf.get("num_hidden_layers") or 1,
            dtype=dtype if dtype is not None else _dtype_of(hf.get("torch_dtype", hf.get("dtype"))),
            extra={k: hf[k] for k in ("eagle_config", "architectures") if k in hf},
            **_variants_from_hf(hf),
        )


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _flag(hf: dict[str, Any], key: str, default: bool | None = False) -> bool | None:
    value = hf.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    return value


def _variants_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """The attention / norm variant fields of a config.json dict, refusing the keys
    of variants that are not implemented."""
    model_type = hf.get("model_type")
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"hidden_act: {act!r} is not supported (only silu)")
    if _flag(hf, "mlp_bias"):
        raise ValueError("mlp_bias: MLP biases are not supported")
    if hf.get("logit_scale") not in (None, 1, 1.0):
        raise ValueError(f"logit_scale: {hf['logit_scale']!r} is not supported (only 1.0)")
    if _flag(hf, "qk_layernorm"):
        raise ValueError("qk_layernorm: a layer norm over the whole q / k projection is not supported")
    use_qk_norm = _flag(hf, "use_qk_norm")
    if use_qk_norm and model_type == "llama4":
        raise ValueError("use_qk_norm: Llama 4's weightless L2 norm of q / k after RoPE is not supported")

    # vLLM's rule (llama.py): attention_bias puts biases on q / k / v and o_proj;
    # qkv_bias, when present, decides q / k / v alone (EAGLE-1 heads of Qwen2 targets).
    attention_bias = _flag(hf, "attention_bias")
    qkv_only = model_type in _QKV_BIAS_ONLY_TYPES
    qkv_bias = _flag(hf, "qkv_bias", default=None)
    o_proj_bias = _flag(hf, "o_proj_bias", default=None)
    qk_norm = _flag(hf, "qk_norm", default=None)

    logits_norm, hidden_feed = True, "prenorm"
    norm_output = _flag(hf, "norm_output", default=None)
    if norm_output is not None:
        if "speculators_model_type" in hf:
            hidden_feed = "normed" if norm_output else "prenorm"
        else:
            logits_norm = norm_output
    return {
        "attention_bias": attention_bias if qkv_bias is None else qkv_bias,
        "o_proj_bias": (attention_bias and not qkv_only) if o_proj_bias is None else o_proj_bias,
        "qk_norm": (model_type in _QK_NORM_TYPES or use_qk_norm) if qk_norm is None else qk_norm,
        "norm_before_residual": _flag(hf, "norm_before_residual"),
        "fc_norm": _flag(hf, "fc_norm"),
        "norm_before_fc": _flag(hf, "norm_before_fc"),
        "logits_norm": logits_norm,
        "hidden_feed": hf.get("hidden_feed") or hidden_feed,
    }


def _dtype_of(name: object) -> torch.dtype:
    if name is None:
        return torch.float32
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ValueError(f"torch_dtype: unsupported value {name!r} (one of {sorted(_DTYPES)})")
    return _DTYPES[name]
