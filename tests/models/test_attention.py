"""Paged KV cache writes and paged attention against plain-Python oracles, on
Hypothesis-generated batch layouts (varied query / sequence lengths, GQA, block
sizes, garbage block-table tails, CUDA-graph padding tokens, NaN in unwritten slots)."""

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdraft.models import PADDING_SLOT_ID, attention, paged_attention, write_kv_cache
from specdraft.models.kv_cache import plan_slot_writes, write_planned


@dataclass
class PagedLayout:
    seq_lens: list[int]
    query_lens: list[int]
    block_size: int
    num_blocks: int
    block_table: list[list[int]]  # only the first ceil(s / block_size) entries of a row are real
    pad_tokens: int  # CUDA-graph padding after the last request
    kv_heads: int
    group: int
    head_dim: int
    extra_query_len: int  # max_query_len bound = max(query_lens) + this
    tight_seq_bound: bool  # max_seq_len = max(seq_lens) instead of the table bound

    def slot(self, b: int, pos: int) -> int:
        return self.block_table[b][pos // self.block_size] * self.block_size + pos % self.block_size


@st.composite
def paged_layouts(draw):
    batch = draw(st.integers(1, 4))
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    seq_lens = draw(st.lists(st.integers(0, 19), min_size=batch, max_size=batch))
    query_lens = [draw(st.integers(0, s)) for s in seq_lens]
    needed = [math.ceil(s / block_size) for s in seq_lens]
    width = max(needed + [1]) + draw(st.integers(0, 2))
    num_blocks = sum(needed) + draw(st.integers(1, 3))
    blocks = draw(st.permutations(range(num_blocks)))
    table, used = [], 0
    for n in needed:
        junk = draw(
            st.lists(st.sampled_from([-1, 0, num_blocks - 1, 10**6, -(2**20)]), min_size=width - n, max_size=width - n)
        )
        table.append(list(blocks[used : used + n]) + junk)
        used += n
    return PagedLayout(
        seq_lens=seq_lens,
        query_lens=query_lens,
        block_size=block_size,
        num_blocks=num_blocks,
        block_table=table,
        pad_tokens=draw(st.integers(0, 2)),
        kv_heads=draw(st.sampled_from([1, 2])),
        group=draw(st.sampled_from([1, 3])),
        head_dim=draw(st.sampled_from([2, 4, 8])),
        extra_query_len=draw(st.integers(0, 2)),
        tight_seq_bound=draw(st.booleans()),
    )


def make_inputs(layout: PagedLayout, device, seed=0):
    """History keys already in the cache, this step's new keys, NaN everywhere else."""
    g = torch.Generator().manual_seed(seed)
    kvh, d, heads = layout.kv_heads, layout.head_dim, layout.kv_heads * layout.group
    cache = torch.full((2, layout.num_blocks, layout.block_size, kvh, d), float("nan"))
    flat = cache.view(2, -1, kvh, d)
    hist, new_k, new_v, slots, qsl = {}, [], [], [], [0]
    for b, (s, q) in enumerate(zip(layout.seq_lens, layout.query_lens, strict=True)):
        for pos in range(s - q):
            kv = torch.randn(2, kvh, d, generator=g)
            flat[:, layout.slot(b, pos)] = kv
            hist[(b, pos)] = kv
        for pos in range(s - q, s):
            new_k.append(torch.randn(kvh, d, generator=g))
            new_v.append(torch.randn(kvh, d, generator=g))
            slots.append(layout.slot(b, pos))
        qsl.append(qsl[-1] + q)
    for _ in range(layout.pad_tokens):
        new_k.append(torch.randn(kvh, d, generator=g))
        new_v.append(torch.randn(kvh, d, generator=g))
        slots.append(PADDING_SLOT_ID)
    t = len(slots)
    empty = torch.zeros(0, kvh, d)
    return {
        "cache": cache.to(device),
        "key": (torch.stack(new_k) if t else empty).to(device),
        "value": (torch.stack(new_v) if t else empty).to(device),
        "query": torch.randn(t, heads, d, generator=g).to(device),
        "slot_mapping": torch.tensor(slots, dtype=torch.int64).to(device),
        "query_start_loc": torch.tensor(qsl, dtype=torch.int32).to(device),
        "seq_lens": torch.tensor(layout.seq_lens, dtype=torch.int32).to(device),
        "block_table": torch.tensor(layout.block_table, dtype=torch.int32).to(device),
        "history": hist,
    }


def spec_attention(layout: PagedLayout, inp):
    """Dense attention per request, one query at a time (plain loops)."""
    query, key, value = inp["query"].cpu(), inp["key"].cpu(), inp["value"].cpu()
    out = torch.zeros_like(query)
    t = 0
    for b, (s, q) in enumerate(zip(layout.seq_lens, layout.query_lens, strict=True)):
        keys, values = [], []
        for pos in range(s):
            if pos < s - q:
                keys.append(inp["history"][(b, pos)][0])
                values.append(inp["history"][(b, pos)][1])
            else:
                keys.append(key[t + pos - (s - q)])
                values.append(value[t + pos - (s - q)])
        for i in range(q):
            visible = s - q + i + 1
            for head in range(query.shape[1]):
                kvh = head // layout.group
                scores = [float(query[t + i, head] @ keys[j][kvh]) / math.sqrt(layout.head_dim) for j in range(visible)]
                top = max(scores)
                weights = [math.exp(x - top) for x in scores]
                total = sum(weights)
                out[t + i, head] = sum(w / total * values[j][kvh] for j, w in enumerate(weights))
        t += q
    return out


def run_step(layout: PagedLayout, inp):
    write_kv_cache(inp["cache"], inp["key"], inp["value"], inp["slot_mapping"])
    max_q = max(layout.query_lens + [1]) + layout.extra_query_len
    max_s = max(layout.seq_lens + [1]) if layout.tight_seq_bound else None
    return paged_attention(
        inp["query"], inp["cache"], inp["query_start_loc"], inp["seq_lens"], inp["block_table"], max_q, max_s
    )


@pytest.mark.kernel
# The models' form (ops.masked_paged_attention: its kernel in the interpreter and CUDA
# lanes, its reference on CPU), the reference itself, and the einsum form benches
# compare them with.
@pytest.mark.parametrize("form", ["kernel", "sdpa", "fp32"])
@given(layout=paged_layouts())
def test_paged_attention_matches_dense_loop(device, layout, form):
    inp = make_inputs(layout, device)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "ATTENTION_FORM", form)
        out = run_step(layout, inp)
    torch.testing.assert_close(out.cpu(), spec_attention(layout, inp), rtol=1e-5, atol=1e-5)


@pytest.mark.kernel
@given(layout=paged_layouts(), seed=st.integers(0, 2**16))
def test_cache_write_touches_valid_slots_only(device, layout, seed):
    inp = make_inputs(layout, device, seed)
    before = inp["cache"].clone()
    write_kv_cache(inp["cache"], inp["key"], inp["value"], inp["slot_mapping"])
    after, expect = inp["cache"].cpu(), before.cpu().clone()
    flat = expect.view(2, -1, layout.kv_heads, layout.head_dim)
    for t, slot in enumerate(inp["slot_mapping"].tolist()):
        if slot != PADDING_SLOT_ID:
            flat[0, slot] = inp["key"][t].cpu()
            flat[1, slot] = inp["value"][t].cpu()
    torch.testing.assert_close(after, expect, rtol=0, atol=0, equal_nan=True)


@pytest.mark.kernel
@pytest.mark.parametrize("slots", [[-1, -1, -1], [-1, 5, -1], [7, -1, -1], [], [3, 40, -7]])
def test_cache_write_skips_every_pad_pattern(device, slots):
    """All PAD, PAD around one real slot, out-of-range and other negative slots."""
    cache = torch.randn(2, 5, 4, 2, 3).to(device)
    before = cache.clone()
    t = len(slots)
    key, value = torch.randn(t, 2, 3).to(device), torch.randn(t, 2, 3).to(device)
    write_kv_cache(cache, key, value, torch.tensor(slots, dtype=torch.int64).to(device))
    expect = before.view(2, 20, 2, 3).clone()
    for i, s in enumerate(slots):
        if 0 <= s < 20:
            expect[0, s], expect[1, s] = key[i], value[i]
    torch.testing.assert_close(cache.view(2, 20, 2, 3), expect, rtol=0, atol=0)


@pytest.mark.kernel
@pytest.mark.parametrize("slots", [[-1, -1, -1], [-1, 5, -1], [3, 40, -7], [0, 19, 8]])
def test_writes_planned_once_for_several_caches(device, slots):
    """plan_slot_writes once, write_planned into three caches (a target pass's
    layers): each cache as the per-slot loop would write it."""
    caches = [torch.randn(2, 5, 4, 2, 3).to(device) for _ in range(3)]
    befores = [c.clone() for c in caches]
    writes = plan_slot_writes(torch.tensor(slots, dtype=torch.int64).to(device), 5, 4)
    for cache, before in zip(caches, befores, strict=True):
        key, value = torch.randn(len(slots), 2, 3).to(device), torch.randn(len(slots), 2, 3).to(device)
        write_planned(cache, key, value, writes)
        expect = before.view(2, 20, 2, 3).clone()
        for i, s in enumerate(slots):
            if 0 <= s < 20:
                expect[0, s], expect[1, s] = key[i], value[i]
        torch.testing.assert_close(cache.view(2, 20, 2, 3), expect, rtol=0, atol=0)


def test_bad_arguments_name_themselves():
    cache = torch.zeros(2, 4, 2, 1, 4)
    q = torch.zeros(3, 2, 4)
    qsl, lens, table = (
        torch.tensor([0, 3], dtype=torch.int32),
        torch.tensor([3], dtype=torch.int32),
        torch.zeros(1, 2, dtype=torch.int32),
    )
    with pytest.raises(ValueError, match="kv_cache"):
        paged_attention(q, cache[0], qsl, lens, table, 3)
    with pytest.raises(ValueError, match="max_seq_len"):
        paged_attention(q, cache, qsl, lens, table, 3, max_seq_len=5)
    with pytest.raises(ValueError, match="max_query_len"):
        paged_attention(q, cache, qsl, lens, table, 0)
    with pytest.raises(ValueError, match="query"):
        paged_attention(torch.zeros(3, 2, 3), cache, qsl, lens, table, 3)
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv_cache(cache, torch.zeros(3, 1, 4), torch.zeros(3, 1, 4), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="key and value"):
        write_kv_cache(cache, torch.zeros(3, 2, 4), torch.zeros(3, 2, 4), torch.zeros(3, dtype=torch.int64))
