"""GPU scale: B = 256 requests with windows up to 1100+ tokens (several token blocks),
the Triton kernels bit-exact against the reference run on the same CUDA tensors."""

import pytest
import torch

from specdraft.ops import shift_and_cache_1d, shift_and_cache_hidden
from specdraft.ops.shift_and_cache.hidden import shift_and_cache_hidden_reference
from specdraft.ops.shift_and_cache.one_d import shift_and_cache_1d_reference
from specdraft.ops.shift_plan import shift_plan, shift_plan_reference

# The Triton kernel against the reference on CUDA tensors; on CPU the op *is* the reference.
pytestmark = pytest.mark.cuda


def large_batch(seed: int, batch: int = 256, max_shift: int = 7):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 1200, (batch,), generator=gen)
    lens[::17] = torch.randint(1024, 1400, lens[::17].shape, generator=gen)  # some windows past 1024
    lens[5::23] = 1  # and single-token ones
    qsl = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32)
    cached = torch.randint(0, max_shift + 1, (batch,), generator=gen).to(torch.int32)
    shift = torch.minimum((torch.rand(batch, generator=gen) * (cached + 1)).long(), lens).to(torch.int32)
    sample = (qsl[1:] - 1 - (torch.rand(batch, generator=gen) * 3).long().clamp(max=lens - 1)).to(torch.int32)
    meta = {"query_start_loc": qsl, "token_indices_to_sample": sample, "shift": shift, "cached_lens": cached}
    return {k: v.cuda() for k, v in meta.items()}, int(qsl[-1]) + 5, int(lens.max()), max_shift


@pytest.mark.parametrize("seed", [0, 1])
def test_large_hidden_bit_exact(seed):
    meta, tokens, max_len, m = large_batch(seed)
    args = (meta["query_start_loc"], meta["token_indices_to_sample"], meta["shift"], meta["cached_lens"])
    src = torch.randn(tokens, 4096, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(256, m, 4096, device="cuda", dtype=torch.bfloat16)
    dst = torch.full_like(src, float("nan"))
    ref_dst, ref_cache = dst.clone(), cache.clone()
    shift_and_cache_hidden(src, dst, cache, *args, max_query_len=max_len)
    shift_and_cache_hidden_reference(src, ref_dst, ref_cache, *args)
    torch.testing.assert_close(dst, ref_dst, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(cache, ref_cache, rtol=0, atol=0)


@pytest.mark.parametrize("rows", [None, 3])
def test_large_1d_bit_exact(rows):
    meta, tokens, max_len, m = large_batch(7)
    args = (meta["query_start_loc"], meta["token_indices_to_sample"], meta["shift"], meta["cached_lens"])
    lead = () if rows is None else (rows,)
    src = torch.randint(0, 1 << 40, (*lead, tokens), device="cuda")
    cache = torch.randint(0, 1 << 40, (*lead, 256, m), device="cuda")
    dst = torch.full_like(src, -1)
    ref_dst, ref_cache = dst.clone(), cache.clone()
    shift_and_cache_1d(src, dst, cache, *args, max_query_len=max_len)
    shift_and_cache_1d_reference(src, ref_dst, ref_cache, *args)
    assert torch.equal(dst, ref_dst) and torch.equal(cache, ref_cache)


def test_large_plan_bit_exact():
    meta, tokens, _, m = large_batch(3, batch=1024, max_shift=8)
    positions = torch.randint(0, 5, (tokens,), device="cuda")
    seq_lens = torch.randint(0, 100_000, (1024,), device="cuda", dtype=torch.int32)
    args = (meta["query_start_loc"], positions, meta["token_indices_to_sample"], seq_lens, meta["cached_lens"], m)
    for got, want in zip(shift_plan(*args), shift_plan_reference(*args), strict=True):
        assert torch.equal(got, want)
