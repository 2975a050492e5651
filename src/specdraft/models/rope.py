"""Rotary position embeddings: plain RoPE and Qwen2-VL's multimodal M-RoPE.

cos / sin are computed from the positions at every call instead of being looked up
in a precomputed table: nothing is indexed by a position, so a clamped or garbage
position can never read out of bounds, and the graph has no data-dependent shape.
Rotation is the "neox" half-split form (rotate_half) used by Llama and Qwen.
"""

from __future__ import annotations

import torch
from torch import nn


def inverse_frequencies(head_dim: int, theta: float, device: torch.device | str | None = None) -> torch.Tensor:
    """[head_dim // 2] float32: theta ** (-2i / head_dim)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    return 1.0 / (theta**exponents)


def mrope_rows(mrope_section: tuple[int, ...]) -> torch.Tensor:
    """[sum(section)] int64: which positions row (0 = t, 1 = h, 2 = w) drives each frequency."""
    return torch.cat([torch.full((n,), row, dtype=torch.int64) for row, n in enumerate(mrope_section)])


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


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; angles: [T, head_dim // 2]. Computed in float32."""
    cos = angles.cos()[:, None, :]
    sin = angles.sin()[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE, or M-RoPE when mrope_section is given. forward(positions, q, k) -> (q, k)."""

    def __init__(self, head_dim: int, theta: float, mrope_section: tuple[int, ...] | None = None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even, got {head_dim}")
        if mrope_section is not None and sum(mrope_section) != head_dim // 2:
            raise ValueError(f"mrope_section must sum to head_dim // 2 = {head_dim // 2}, got {tuple(mrope_section)}")
        self.head_dim = head_dim
        self.theta = float(theta)
        self.mrope_section = None if mrope_section is None else tuple(mrope_section)
        # Non-persistent: derived from the config, never part of a checkpoint. (The
        # inverse frequencies are rebuilt per call instead, so that model.to(bfloat16)
        # cannot round them; under torch.compile they are a folded constant.)
        rows = mrope_rows(self.mrope_section) if self.mrope_section is not None else None
        self.register_buffer("mrope_rows", rows, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = inverse_frequencies(self.head_dim, self.theta, positions.device)
        angles = rope_angles(positions, inv_freq, self.mrope_rows)
        return apply_rotary(q, angles), apply_rotary(k, angles)
