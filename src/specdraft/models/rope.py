"""Rotary position embeddings: plain RoPE, its scaled variants (linear,
YaRN, Llama 3), and multimodal M-RoPE in Qwen2-VL's section layout or Qwen3-VL's
interleaved layout.

cos / sin are computed from the positions at every call instead of being looked up
in a precomputed table: nothing is indexed by a position, so a clamped or garbage
position can never read out of bounds, and the graph has no data-dependent shape.
Rotation is the "neox" half-split form (rotate_half) used by Llama and Qwen.

The inverse frequencies of every variant are built with the same float32 operations,
in the same order, as transformers' ROPE_INIT_FUNCTIONS, so the rotated q / k agree
with it to float32 rounding at any position. They depend on the config only (a
scaling is static): under torch.compile they fold to a constant.

Dynamic NTK scaling is refused (DYNAMIC_NTK_REFUSAL says why): its rotation
depends on the length of the call it runs in, which a draft served with a KV cache
cannot follow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

ROPE_TYPES = ("linear", "yarn", "llama3")
DYNAMIC_NTK_REFUSAL = (
    "dynamic NTK RoPE is refused. Its rotation is rescaled from the length of each call "
    "(transformers: the batch's longest sequence; vLLM: a static NTK base instead), and past "
    "max_position_embeddings no drafter with a KV cache can reproduce it: keys cached at earlier "
    "steps keep the rotation of the step that wrote them, and the training unroll shares one "
    "first pass between every chain. Below max_position_embeddings it is the plain rotation: "
    "remove the key from config.json if your sequences stay there, or convert the model to a "
    "static scaling (linear, yarn, llama3)"
)


@dataclass(frozen=True)
class RopeScaling:
    """A scaled RoPE with every parameter resolved (defaults already filled in; see
    specdraft.models.rope_config for how config.json's two spellings map here).

    linear: inverse frequencies / factor.
    llama3: Llama 3.1's wavelength-banded interpolation (factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings). yarn: YaRN's ramp between
    interpolated and extrapolated frequencies (factor, beta_fast, beta_slow,
    truncate, original_max_position_embeddings), plus attention_factor, which scales
    cos and sin (so attention logits by its square)."""

    rope_type: str
    factor: float
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.rope_type == "dynamic":
            raise ValueError(f"rope_type: {DYNAMIC_NTK_REFUSAL}")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}")
        if not _positive(self.factor):
            raise ValueError(f"factor must be a positive number, got {self.factor!r}")
        if not _positive(self.attention_factor):
            raise ValueError(f"attention_factor must be a positive number, got {self.attention_factor!r}")
        if self.rope_type in ("llama3", "yarn"):
            ompe = self.original_max_position_embeddings
            if isinstance(ompe, bool) or not isinstance(ompe, int) or ompe < 1:
                raise ValueError(
                    f"original_max_position_embeddings must be a positive int for {self.rope_type} RoPE, got {ompe!r}"
                )
        if self.rope_type == "llama3":
            low, high = self.low_freq_factor, self.high_freq_factor
            if not (_positive(low) and _positive(high) and high > low):
                raise ValueError(
                    f"low_freq_factor / high_freq_factor must be positive with high > low, got {low!r} / {high!r}"
                )
        if self.rope_type == "yarn" and not (_number(self.beta_fast) and _number(self.beta_slow)):
            raise ValueError(f"beta_fast / beta_slow must be numbers, got {self.beta_fast!r} / {self.beta_slow!r}")


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _positive(x: object) -> bool:
    return _number(x) and x > 0


def inverse_frequencies(head_dim: int, theta: float, device: torch.device | str | None = None) -> torch.Tensor:
    """[head_dim // 2] float32: theta ** (-2i / head_dim)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).to(torch.float32) / head_dim
    return 1.0 / powers_of(theta, exponents)


def powers_of(base: float, exponents: torch.Tensor) -> torch.Tensor:
    """base ** exponents, bit for bit, with the base multiplied into a tensor first.
    torch.compile(dynamic=True) traces a module's float attribute (theta) as a
    symbol; `float ** tensor` is an op it cannot turn that symbol into a tensor
    for, so Dynamo would throw the whole trace away and start again with the float
    constant (the propose loop traced twice: its cold compile doubled). A product
    with a tensor it can turn, and float32(theta) ** e is what both compute."""
    return (torch.ones_like(exponents) * base).pow(exponents)


def scaled_inverse_frequencies(
    head_dim: int,
    theta: float,
    scaling: RopeScaling | None,
    device: torch.device | str | None = None,
    constants: tuple[float, ...] | None = None,
) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies of plain RoPE (scaling None) or of
    a scaled variant. constants: scaling_constants(head_dim, theta, scaling), when the
    caller has them (computed here otherwise)."""
    if scaling is None:
        return inverse_frequencies(head_dim, theta, device)
    if scaling.rope_type == "linear":
        return inverse_frequencies(head_dim, theta, device) / scaling.factor
    if constants is None:
        constants = scaling_constants(head_dim, theta, scaling)
    if scaling.rope_type == "llama3":
        return _llama3_inverse_frequencies(head_dim, theta, scaling, device, constants)
    return _yarn_inverse_frequencies(head_dim, theta, scaling, device, constants)


def scaling_constants(head_dim: int, theta: float, s: RopeScaling | None) -> tuple[float, ...] | None:
    """The Python numbers a scaled variant derives from its config alone: llama3's
    band edges (as wavelengths) and blend width, YaRN's ramp bounds; None for the
    others. RotaryEmbedding computes them once, at construction: in a forward traced
    by torch.compile(dynamic=True), arithmetic between float attributes is an op
    Dynamo cannot keep symbolic (torch 2.11), so it would pin the floats and restart
    its trace (see powers_of)."""
    if s is None or s.rope_type == "linear":
        return None
    if s.rope_type == "llama3":
        old_context = s.original_max_position_embeddings
        return (old_context / s.low_freq_factor, old_context / s.high_freq_factor,
                s.high_freq_factor - s.low_freq_factor)  # fmt: skip
    return yarn_ramp_bounds(head_dim, theta, s)


TWO_PI = 2 * math.pi


def _llama3_inverse_frequencies(head_dim, theta, s: RopeScaling, device, constants) -> torch.Tensor:
    # Wavelengths shorter than original / high_freq_factor keep their frequency,
    # longer than original / low_freq_factor are divided by factor, and the band in
    # between is blended linearly in (original / wavelength).
    inv_freq = inverse_frequencies(head_dim, theta, device)
    low_freq_wavelen, high_freq_wavelen, blend_width = constants
    wavelen = TWO_PI / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / blend_width
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_correction_range(head_dim: int, theta: float, s: RopeScaling) -> tuple[float, float]:
    """The frequency indices [low, high] between which YaRN ramps from extrapolation
    (index < low: frequency kept) to interpolation (index > high: divided by factor)."""

    def dim_of(num_rotations: float) -> float:
        # The index whose wavelength turns num_rotations times over the original context.
        return (
            head_dim
            * math.log(s.original_max_position_embeddings / (num_rotations * 2 * math.pi))
            / (2 * math.log(theta))
        )

    low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


def yarn_ramp_bounds(head_dim: int, theta: float, s: RopeScaling) -> tuple[float, float]:
    """yarn_correction_range with a one-index ramp widened to keep its slope finite."""
    low, high = yarn_correction_range(head_dim, theta, s)
    return (low, high + 0.001) if low == high else (low, high)


def _yarn_inverse_frequencies(head_dim, theta, s: RopeScaling, device, bounds) -> torch.Tensor:
    pos_freqs = powers_of(theta, torch.arange(0, head_dim, 2, device=device).to(torch.float32) / head_dim)
    extrapolated = 1.0 / pos_freqs
    interpolated = 1.0 / (s.factor * pos_freqs)
    low, high = bounds  # yarn_ramp_bounds
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return interpolated * (1 - keep) + extrapolated * keep


def mrope_rows(mrope_section: tuple[int, ...], interleaved: bool = False) -> torch.Tensor:
    """[sum(section)] int64: which positions row (0 = t, 1 = h, 2 = w) drives each
    frequency. Qwen2-VL's layout is contiguous sections (t t .. h h .. w w ..);
    Qwen3-VL's interleaved layout cycles t h w t h w ..., frequency i taking row h
    when i % 3 == 1 and i < 3 * h, row w when i % 3 == 2 and i < 3 * w, else t. A
    section the interleaved cycle cannot realise (h or w too large for its share of
    the cycle) is a ValueError naming mrope_section."""
    section = tuple(mrope_section)
    if not interleaved:
        return torch.cat([torch.full((n,), row, dtype=torch.int64) for row, n in enumerate(section)])
    freqs = sum(section)
    rows = torch.zeros(freqs, dtype=torch.int64)
    for row in (1, 2):
        rows[row : 3 * section[row] : 3] = row
    counts = tuple(int((rows == r).sum()) for r in range(3))
    if counts != section:
        raise ValueError(
            f"mrope_section: {section} cannot be laid out interleaved over {freqs} frequencies "
            f"(the t h w cycle gives {counts}); h and w need 3 * size <= {freqs} + row"
        )
    return rows


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """[T, head_dim // 2] float32 angles. positions: [T], or [3, T] with `rows` from
    mrope_rows (frequency i turns with positions[rows[i]]). 1-D positions with rows
    set mean text-only input: all three rows equal."""
    pos = positions.to(torch.float32)
    if pos.dim() == 1 or rows is None:
        if pos.dim() == 2:  # M-RoPE positions fed to a plain-RoPE model: rows are equal for text
            pos = pos[0]
        return pos[:, None] * inv_freq[None, :]
    # Gather one positions row per frequency: [F, T] -> [T, F].
    per_freq = pos.index_select(0, rows).transpose(0, 1)
    return per_freq * inv_freq[None, :]


def apply_rotary(x: torch.Tensor, angles: torch.Tensor, attention_factor: float | None = None) -> torch.Tensor:
    """x: [T, heads, head_dim]; angles: [T, head_dim // 2]. Computed in float32;
    cos and sin are scaled by attention_factor (YaRN's mscale) unless it is None.
    None, not 1.0, says "unscaled": a test of a float against 1.0 is a branch that
    torch.compile(dynamic=True) cannot keep symbolic, and it would restart its trace
    with the float constant (see powers_of)."""
    cos = angles.cos()[:, None, :]
    sin = angles.sin()[:, None, :]
    if attention_factor is not None:
        cos, sin = cos * attention_factor, sin * attention_factor
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE (optionally scaled), or M-RoPE when mrope_section is given (interleaved:
    Qwen3-VL's layout). forward(positions, q, k) -> (q, k)."""

    def __init__(
        self,
        head_dim: int,
        theta: float,
        mrope_section: tuple[int, ...] | None = None,
        scaling: RopeScaling | None = None,
        mrope_interleaved: bool = False,
    ) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even, got {head_dim}")
        if mrope_section is not None and sum(mrope_section) != head_dim // 2:
            raise ValueError(f"mrope_section must sum to head_dim // 2 = {head_dim // 2}, got {tuple(mrope_section)}")
        if mrope_interleaved and mrope_section is None:
            raise ValueError("mrope_interleaved: needs an mrope_section")
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise ValueError(f"scaling must be a RopeScaling or None, got {type(scaling).__name__}")
        self.head_dim = head_dim
        self.theta = float(theta)
        self.scaling = scaling
        self.attention_factor = 1.0 if scaling is None else float(scaling.attention_factor)
        self.cos_sin_scale = None if self.attention_factor == 1.0 else self.attention_factor
        self.scaling_constants = scaling_constants(head_dim, self.theta, scaling)
        self.mrope_section = None if mrope_section is None else tuple(mrope_section)
        self.mrope_interleaved = bool(mrope_interleaved)
        # Non-persistent: derived from the config, never part of a checkpoint. (The
        # inverse frequencies are rebuilt per call instead, so that model.to(bfloat16)
        # cannot round them; under torch.compile they are a folded constant.)
        rows = None if self.mrope_section is None else mrope_rows(self.mrope_section, self.mrope_interleaved)
        self.register_buffer("mrope_rows", rows, persistent=False)

    def inverse_frequencies(self, device: torch.device | str | None = None) -> torch.Tensor:
        return scaled_inverse_frequencies(self.head_dim, self.theta, self.scaling, device, self.scaling_constants)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = rope_angles(positions, self.inverse_frequencies(positions.device), self.mrope_rows)
        return apply_rotary(q, angles, self.cos_sin_scale), apply_rotary(k, angles, self.cos_sin_scale)

    def rotate(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """One tensor rotated at `positions` (keys without queries)."""
        angles = rope_angles(positions, self.inverse_frequencies(positions.device), self.mrope_rows)
        return apply_rotary(x, angles, self.cos_sin_scale)
