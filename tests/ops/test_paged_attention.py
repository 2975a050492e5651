"""masked_paged_attention against a plain-loop oracle (one query, one head, one
softmax at a time, in float64), in every lane (`kernel`: the CPU reference, the
interpreted kernels, CUDA): random visibility masks (tree-like and causal), rows
that see nothing, NaN in every slot no query reads, GQA groups, head dims that are
not powers of two, sequences over several splits, bf16; then opcheck, the bad
arguments, and a fullgraph compile."""

import math

import pytest
import torch

from specdraft.ops.paged_attention import masked_paged_attention
from specdraft.testing import CompileCounts, fresh_compile

from fixtures.lanes import INTERPRETER

# (batch, queries, kv_heads, group, head_dim, keys per request, block size)
SHAPES = [
    (1, 1, 1, 1, 16, 5, 4),
    (2, 3, 2, 2, 8, 37, 4),
    (3, 16, 2, 4, 24, 150, 16),
    (1, 7, 1, 5, 64, 300, 16),
    (1, 20, 1, 4, 16, 40, 8),
]  # the last: 80 query rows, two row blocks of 64


def make_case(shape, seed, dtype=torch.float32, device="cpu"):
    batch, num_queries, kv_heads, group, dim, seq_len, block_size = shape
    gen = torch.Generator().manual_seed(seed)
    blocks_per_request = math.ceil(seq_len / block_size)
    num_blocks = batch * blocks_per_request + 3
    cache = torch.full((2, num_blocks, block_size, kv_heads, dim), float("nan"))
    order = torch.randperm(num_blocks, generator=gen)[: batch * blocks_per_request].view(batch, -1)
    key_pos = torch.arange(seq_len)
    slots = order[:, key_pos // block_size] * block_size + key_pos % block_size
    visible = torch.rand(batch, num_queries, seq_len, generator=gen) < 0.6
    visible[0, -1] = False  # a query that sees nothing
    if num_queries > 2:
        visible[-1, 1] = key_pos <= seq_len - num_queries + 1  # a causal row
    seen = visible.any(1)  # only slots some query reads hold numbers; the rest stay NaN
    for b in range(batch):
        chosen = slots[b][seen[b]]
        cache[:, chosen.div(block_size, rounding_mode="floor"), chosen % block_size] = torch.randn(
            2, chosen.numel(), kv_heads, dim, generator=gen
        )
    query = torch.randn(batch, num_queries, kv_heads * group, dim, generator=gen)
    scale = dim**-0.5
    return query.to(device, dtype), cache.to(device, dtype), slots.to(device), visible.to(device), scale


def oracle(query, cache, slots, visible, scale):
    query, cache, slots, visible = (t.cpu().double() if t.is_floating_point() else t.cpu() for t in
                                    (query, cache, slots, visible))  # fmt: skip
    batch, num_queries, heads, dim = query.shape
    kv_heads, block_size = cache.shape[3], cache.shape[2]
    out = torch.zeros_like(query)
    for b in range(batch):
        for q in range(num_queries):
            keys = [int(slot) for slot, sees in zip(slots[b], visible[b, q], strict=True) if sees]
            for head in range(heads):
                kv = head // (heads // kv_heads)
                rows = [(slot // block_size, slot % block_size) for slot in keys]
                scores = [float(query[b, q, head] @ cache[0, i, j, kv]) * scale for i, j in rows]
                if not scores:
                    continue
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for w, (i, j) in zip(weights, rows, strict=True):
                    out[b, q, head] += w / total * cache[1, i, j, kv]
    return out


@pytest.mark.kernel
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_the_plain_loop(device, shape):
    args = make_case(shape, seed=sum(shape), device=device)
    got = masked_paged_attention(*args)
    assert got.shape == args[0].shape and got.dtype == args[0].dtype
    assert not got.isnan().any()
    torch.testing.assert_close(got.cpu().double(), oracle(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.kernel
@pytest.mark.skipif(INTERPRETER, reason="the interpreter's bf16 emulation returns garbage here (~8e8) for fp32-exact "
                    "kernels too; bf16 runs on CUDA and through the CPU reference")  # fmt: skip
def test_bf16_within_bf16_rounding_of_the_plain_loop(device):
    args = make_case(SHAPES[2], seed=5, dtype=torch.bfloat16, device=device)
    got = masked_paged_attention(*args).cpu().double()
    want = oracle(*args)
    assert (got - want).abs().max() < 2e-2  # a few bf16 ulps of outputs of size ~1


def test_opcheck(device):
    for shape in SHAPES[:3]:
        torch.library.opcheck(torch.ops.specdraft.masked_paged_attention, make_case(shape, seed=1, device=device))


def test_fullgraph_compile_equals_eager(device):
    args = make_case(SHAPES[1], seed=2, device=device)
    compiled = fresh_compile(masked_paged_attention, fullgraph=True, dynamic=False)
    with CompileCounts.measure() as counts:
        got = compiled(*args)
    torch.testing.assert_close(got, masked_paged_attention(*args), rtol=1e-5, atol=1e-6)
    assert counts.graph_breaks == 0 and counts.compiles == 1


def test_bad_arguments_name_themselves():
    query, cache, slots, visible, scale = make_case(SHAPES[1], seed=3)
    bad = [
        ("query", (query[0], cache, slots, visible)),
        ("query", (query[:, :, :3], cache, slots, visible)),
        ("slots", (query, cache, slots.int(), visible)),
        ("visible", (query, cache, slots, visible.int())),
        ("visible", (query, cache, slots, visible[:, :, :-1])),
        ("kv_cache", (query, cache.double(), slots, visible)),
    ]
    for name, args in bad:
        with pytest.raises(ValueError, match=name):
            masked_paged_attention(*args, scale)


@pytest.mark.kernel
def test_no_keys_gives_zeros(device):
    query, cache, slots, visible, scale = make_case(SHAPES[1], seed=4, device=device)
    got = masked_paged_attention(query, cache, slots[:, :0], visible[:, :, :0], scale)
    assert torch.equal(got, torch.zeros_like(query))


def test_launch_shape_stays_concrete_under_dynamic_sizes():
    """The CUDA launch geometry from SymInts, as Dynamo hands it under dynamic shapes
    with backed_size_oblivious (an engine's setting): the tiles (constexprs) come out
    as ints, the counts as plain arithmetic of the sizes, with no bitwise expression
    (triton.next_power_of_2 on a SymInt built one, which failed the compiled
    autoregressive proposer on CUDA), and both equal the arithmetic on plain ints."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental import _config as shape_config
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    from specdraft.ops.paged_attention.op import MAX_ROWS, SPLIT_LEN, launch_shape

    def expected(num_queries, heads, kv_heads, seq_len, dim):
        rows = min(MAX_ROWS, max(16, 2 ** math.ceil(math.log2(heads // kv_heads * num_queries))))
        return rows, math.ceil(heads // kv_heads * num_queries / rows), math.ceil(seq_len / SPLIT_LEN), \
            max(16, 2 ** math.ceil(math.log2(dim)))  # fmt: skip

    for num_queries, heads, kv_heads, seq_len, dim in [(9, 4, 2, 9, 8), (1, 32, 8, 1040, 128), (20, 4, 1, 300, 24)]:
        mode = FakeTensorMode(shape_env=ShapeEnv())
        dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 3)
        with shape_config.patch(backed_size_oblivious=True, use_duck_shape=False):
            sizes = mode.from_tensor(torch.empty(num_queries, seq_len, dim), symbolic_context=dynamic).shape
            got = launch_shape(sizes[0], heads, kv_heads, sizes[1], sizes[2])
        assert isinstance(got[0], int) and isinstance(got[3], int)
        assert not any("bitwise" in str(count).lower() for count in got[1:3])
        assert [int(value) for value in got] == list(expected(num_queries, heads, kv_heads, seq_len, dim))


DYNAMIC_TEST_HEAD_DIM = 8


def test_dynamic_sizes_compile_without_breaks(device):
    """Batch and key counts change under one dynamic=True graph with the settings an
    engine uses; every result equals the plain loop. The scale comes from the head
    size, an int (a Python float argument or closure would be traced as a symbol under
    dynamic=True, then pinned by the op: a restart, the whole trace thrown away)."""
    dim = DYNAMIC_TEST_HEAD_DIM

    def attention(query, cache, slots, visible):
        return masked_paged_attention(query, cache, slots, visible, DYNAMIC_TEST_HEAD_DIM**-0.5)

    compiled = fresh_compile(attention, fullgraph=True, dynamic=True, backend="aot_eager")
    with (
        torch.fx.experimental._config.patch(backed_size_oblivious=True, use_duck_shape=False),
        CompileCounts.measure() as counts,
    ):
        for batch, seq_len in [(1, 9), (3, 37), (2, 150)]:
            args = make_case((batch, 3, 2, 2, dim, seq_len, 4), seed=batch, device=device)
            assert args[-1] == dim**-0.5
            torch.testing.assert_close(compiled(*args[:-1]).cpu().double(), oracle(*args), rtol=1e-5, atol=1e-5)
    assert counts.graph_breaks == 0 and counts.compiles == 1 and counts.restarts == 0
