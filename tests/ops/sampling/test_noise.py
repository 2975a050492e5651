"""The counter-based noise (ops/sampling/noise.py) against the hash on Python ints:
the raw bits and the uniforms, in every lane, and the interpreted kernel against
the torch twin bit for bit."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdraft.ops import noise_uniform
from specdraft.ops.sampling.noise import gumbel2_torch, noise_bits_reference, uniform_torch

import specs.sampling as spec

# ----------------------------------------------------------------------- the hash


@pytest.mark.kernel
@given(
    seeds=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=4),
    position=st.integers(0, 2**63 - 1),
    vocab=st.integers(1, 80),
    salt=st.integers(0, 2**31 - 1),
    stream=st.sampled_from([0, 1, 2]),
)
def test_noise_matches_python_hash(device, seeds, position, vocab, salt, stream):
    s = torch.tensor(seeds, dtype=torch.int64, device=device)
    p = torch.full_like(s, position)
    got = torch.ops.specdraft.noise_bits(s, p, vocab, salt, stream).cpu().tolist()
    want = [[spec.bits(spec.row_key(seed, position, salt, stream), i) for i in range(vocab)] for seed in seeds]
    assert got == want
    u = noise_uniform(s, p, vocab, salt=salt, stream=stream).cpu().tolist()
    assert u == [[spec.uniform(w) for w in row] for row in want]  # exact: 23 bits + 0.5 fit fp32
    assert all(0 < v < 1 for row in u for v in row)


def test_uniform_extremes_stay_inside_the_open_interval():
    top, bottom = spec.uniform(0xFFFFFFFF), spec.uniform(0)
    t = torch.tensor([0xFFFFFFFF, 0], dtype=torch.int64)
    assert uniform_torch(t).tolist() == [top, bottom]
    assert top < 1 and bottom > 0 and torch.isfinite(gumbel2_torch(t)).all()


# ---------------------------------------------------------- interpreter lane only


@pytest.mark.interpreter
def test_interpreted_noise_bits_equal_reference():
    seeds = torch.tensor([0, -1, 2**62 + 3, 17])
    positions = torch.tensor([5, 2**40, 0, 2**63 - 1])
    for stream in (0, 1, 2):
        got = torch.ops.specdraft.noise_bits(seeds, positions, 100, 77, stream)
        assert torch.equal(got, noise_bits_reference(seeds, positions, 100, 77, stream))
