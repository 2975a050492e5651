"""RoPE and M-RoPE against a loop over tokens, heads and frequency pairs (the scaled
variants and Qwen3-VL's interleaved layout: test_rope_scaling.py, against transformers)."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdraft.models import RotaryEmbedding


def tolerance(positions) -> float:
    """float32 angles: position * inv_freq is off by ~position * 2**-22 radians, as in
    every float32 RoPE (HF's included); inputs are |x| < ~5."""
    return 1e-5 + 5 * max(positions + [0]) * 2.0**-22


def randn(*shape, seed=[0]):  # noqa: B006 - a counter: deterministic inputs per example
    seed[0] += 1
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed[0]))


def spec_rotate(x, pos_of_freq, theta):
    """x [T, H, D]; pos_of_freq(t, i) is the position turning frequency i of token t."""
    t_len, heads, d = x.shape
    half = d // 2
    out = torch.zeros(t_len, heads, d, dtype=torch.float64)
    for t in range(t_len):
        for i in range(half):
            angle = pos_of_freq(t, i) * theta ** (-2 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            for h in range(heads):
                a, b = float(x[t, h, i]), float(x[t, h, i + half])
                out[t, h, i] = a * c - b * s
                out[t, h, i + half] = b * c + a * s
    return out


@st.composite
def rope_cases(draw, mrope: bool):
    half = draw(st.integers(1, 8))
    t = draw(st.integers(0, 6))
    rows = 3 if mrope else 1
    positions = draw(st.lists(st.integers(0, 5000), min_size=rows * t, max_size=rows * t))
    section = None
    if mrope:
        a = draw(st.integers(0, half))
        b = draw(st.integers(0, half - a))
        section = (a, b, half - a - b)
    theta = draw(st.sampled_from([10000.0, 1e6, 500.0]))
    return half * 2, t, positions, section, theta


@pytest.mark.kernel
@given(case=rope_cases(mrope=False))
def test_rope_matches_loop(device, case):
    d, t, positions, _, theta = case
    rope = RotaryEmbedding(d, theta).to(device)
    q, k = randn(t, 3, d), randn(t, 1, d)
    pos = torch.tensor(positions, dtype=torch.int64)
    rq, rk = rope(pos.to(device), q.to(device), k.to(device))
    for x, got in ((q, rq), (k, rk)):
        want = spec_rotate(x, lambda tok, i: positions[tok], theta)
        torch.testing.assert_close(got.cpu().double(), want, rtol=0, atol=tolerance(positions))


@pytest.mark.kernel
@given(case=rope_cases(mrope=True))
def test_mrope_matches_loop(device, case):
    d, t, positions, section, theta = case
    rope = RotaryEmbedding(d, theta, section).to(device)
    pos = torch.tensor(positions, dtype=torch.int64).view(3, t)
    row_of = [row for row, n in enumerate(section) for _ in range(n)]
    q, k = randn(t, 2, d), randn(t, 2, d)
    rq, rk = rope(pos.to(device), q.to(device), k.to(device))
    for x, got in ((q, rq), (k, rk)):
        want = spec_rotate(x, lambda tok, i: int(pos[row_of[i], tok]), theta)
        torch.testing.assert_close(got.cpu().double(), want, rtol=0, atol=tolerance(positions))


@pytest.mark.kernel
@given(case=rope_cases(mrope=True))
def test_mrope_with_equal_rows_is_rope(device, case):
    d, t, positions, section, theta = case
    pos = torch.tensor(positions[:t], dtype=torch.int64).to(device)
    q, k = randn(t, 2, d).to(device), randn(t, 1, d).to(device)
    plain = RotaryEmbedding(d, theta).to(device)(pos, q, k)
    mrope = RotaryEmbedding(d, theta, section).to(device)
    for got in (mrope(torch.stack([pos] * 3), q, k), mrope(pos, q, k)):  # 1-D positions = text-only
        for a, b in zip(got, plain, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_rope_keeps_dtype_and_rejects_bad_sections():
    rope = RotaryEmbedding(8, 10000.0).to(torch.bfloat16)
    q = torch.randn(2, 1, 8, dtype=torch.bfloat16)
    assert rope(torch.tensor([0, 3]), q, q)[0].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="mrope_section"):
        RotaryEmbedding(8, 10000.0, (1, 1, 1))
    with pytest.raises(ValueError, match="head_dim"):
        RotaryEmbedding(7, 10000.0)
    with pytest.raises(ValueError, match="mrope_interleaved"):
        RotaryEmbedding(8, 10000.0, None, mrope_interleaved=True)
    # Interleaved over 8 frequencies, w gets indices 2 and 5 only: 3 cannot be laid out.
    with pytest.raises(ValueError, match="mrope_section"):
        RotaryEmbedding(16, 10000.0, (2, 3, 3), mrope_interleaved=True)
    with pytest.raises(ValueError, match="scaling"):
        RotaryEmbedding(8, 10000.0, scaling={"rope_type": "linear", "factor": 2.0})
