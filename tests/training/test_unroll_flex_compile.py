"""The flex path of the unroll's attention under Inductor, as users compile it: the
mask's captures computed inside the graph from cu_seqlens, any sequence count, one
graph across sequence counts (issue 24).

On the GPU these failed three ways in torch 2.11: captures that were unstored
expressions were inlined into the flex template (a Triton codegen crash at one
sequence), the short-query flex_decoding kernel rejected every config, and the
backward's block lists failed to lower under dynamic shapes (CantSplit). What the
CPU can check:

- chain_attention with flex, compiled by Inductor (the CPU C++ template) with
  dynamic=True, its captures computed in the graph from cu_seqlens, at 1, 3 and 8
  sequences against dense: this failed on CPU too before the fix (NoValidChoicesError:
  the same unrealised captures), and compiles once for all three;
- the whole unroll with flex compiled by Inductor on CPU, one graph at 1 and 8
  sequences: the sequence count symbolic, the row count static (CPU Inductor's C++
  flex template miscompiles several flex calls of one graph when the rows are
  dynamic, `cur_qSplitSize0` undeclared, a CPU-only bug; the GPU rows of
  benchmarks/bench_unroll.py compile the unroll with dynamic=True);
- structurally, in the graph Inductor receives (CUDA-only decisions cannot run on
  CPU): every flex call asks for the main Triton kernel, and every tensor its mask
  captures comes out of specdraft.materialize, a stored buffer;
- the block mask, built from block bounds, against the mask rule pair by pair: every
  visible pair lies in a kept block, and a block marked full is visible everywhere.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.testing import CompileCounts, fresh_compile
from specdraft.training import unroll, unroll_for_eval
from specdraft.training.attention import BLOCK, chain_attention, flex_chain_attention
from specdraft.training.unroll import PackedLayout

from fixtures.unroll_batches import head_for, make_packed

# CPU lane: Inductor keeps its SIMD code generation here (tests/conftest.py).
pytestmark = pytest.mark.vectorised

# Sizes chosen apart from the sequence counts below, so that Dynamo's duck sizing
# never ties cu_seqlens' length to a head count (it would then specialise on it).
HEADS, KV_HEADS, DIM, NUM_DIAG = 6, 3, 16, 5


def in_graph_attention(q, ctx_k, ctx_v, diag_k, diag_v, cu_seqlens, backend="flex"):
    """The unroll's pattern: seq_id and diag_visible computed inside the graph."""
    num_rows = q.shape[1]
    layout = PackedLayout.from_cu_seqlens(cu_seqlens, num_rows)
    rows = torch.arange(num_rows, device=q.device)
    # Diagonal block c visible where the row is at least c + 1 rows into its sequence.
    depth = torch.arange(diag_k.shape[0], device=q.device)[:, None]
    diag_visible = (rows[None, :] - layout.start[None, :] > depth)[None].expand(q.shape[0], -1, -1)
    return chain_attention(q, ctx_k, ctx_v, diag_k, diag_v, seq_id=layout.seq_id, ctx_offset=1,
                           diag_visible=diag_visible, backend=backend)  # fmt: skip


def attention_inputs(lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    num_rows = sum(lengths)
    q = torch.randn(2, num_rows, HEADS, DIM, generator=gen)
    ctx_k, ctx_v = (torch.randn(num_rows, KV_HEADS, DIM, generator=gen) for _ in range(2))
    diag_k, diag_v = (torch.randn(NUM_DIAG, num_rows, KV_HEADS, DIM, generator=gen) for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q, ctx_k, ctx_v, diag_k, diag_v, cu


@pytest.mark.parametrize("lengths", [[150], [60, 1, 90], [20, 17, 1, 30, 26, 9, 40, 33]], ids=["S1", "S3", "S8"])
def test_compiled_flex_attention_any_sequence_count(lengths):
    """Inductor (static shapes: see the module docstring), captures from cu_seqlens:
    1, 3 and 8 sequences (one of 150 rows, more than a block: the case that crashed
    on the GPU), equal to dense."""
    compiled = fresh_compile(in_graph_attention, fullgraph=True, dynamic=False)
    args = attention_inputs(lengths, len(lengths))
    with CompileCounts.measure() as counts, torch.no_grad():
        got = compiled(*args)
    torch.testing.assert_close(got, in_graph_attention(*args, backend="dense"), atol=1e-5, rtol=1e-5)
    assert counts.graph_breaks == 0 and counts.compiles == 1


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_compiled_flex_unroll_equals_dense():
    """The whole unroll (multi-layer: diagonal masks computed in the graph) compiled
    by Inductor with flex, one graph for one sequence (the count that crashed) and
    for 8: 150 rows each, the sequence count symbolic (cu_seqlens' length marked
    dynamic, as a training step sees varying counts), the rows static (see the
    module docstring). The static one-sequence specialisation is the attention
    test's S1 case above."""
    head, width, loop = head_for("multi_layer", False)
    compiled = fresh_compile(
        lambda *a: unroll_for_eval(head, *a, num_steps=3, loop=loop, attention="flex"), fullgraph=True, dynamic=False
    )
    with CompileCounts.measure() as counts:
        for lengths in ([150], [20] * 7 + [10]):
            packed = make_packed(lengths, target_hidden=width, mrope=False, seed=len(lengths))
            torch._dynamo.mark_dynamic(packed.cu_seqlens, 0)
            want = unroll_for_eval(head, *packed.unroll_args(), num_steps=3, loop=loop, attention="dense")
            got = compiled(*packed.unroll_args())
            assert torch.equal(got.draft_tokens, want.draft_tokens)
            torch.testing.assert_close(got.logits, want.logits, atol=2e-5, rtol=1e-5)
    assert counts.graph_breaks == 0 and counts.compiles == 1, counts


# ------------------------------------------------------------ the graph Inductor gets


def graphs_of(fn, *args):
    """The graphs AOT autograd hands to the compiler (forward, and backward when
    autograd records), run eagerly."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    backend = aot_autograd(fw_compiler=record, bw_compiler=record)
    out = fresh_compile(fn, backend=backend, fullgraph=True, dynamic=True)(*args)
    return graphs, out


def flex_nodes(graph):
    return [n for n in graph.graph.nodes if n.op == "call_function" and "flex_attention" in str(n.target)]


@pytest.mark.parametrize("kind", ["eagle3", "multi_layer"])
def test_every_flex_call_asks_for_triton_and_captures_stored_buffers(kind):
    """Every flex_attention in the compiled unroll's forward graph: kernel_options
    BACKEND "TRITON" (never flex_decoding, which rejects every config for some short
    queries), and each tensor its mask captures produced by specdraft::materialize (a
    stored buffer, never an expression Inductor would inline into the template). The
    backward reuses the forward's block mask and captures; CPU flex has no backward
    to trace, so the CUDA test below runs it."""
    head, width, loop = head_for(kind, False)
    packed = make_packed([5, 1, 7], target_hidden=width, mrope=False, seed=0)
    graphs, _ = graphs_of(
        lambda *args: unroll_for_eval(head, *args, num_steps=3, loop=loop, attention="flex").logits,
        *packed.unroll_args(),
    )
    nodes = [n for g in graphs for n in flex_nodes(g)]
    # EAGLE: one call per step. Multi-layer (draft tokens): the first pass, then a shared
    # and an own pass per step, less the last shared pass, which feeds nothing.
    assert len(nodes) == (3 if kind == "eagle3" else 4)
    for node in nodes:
        options = next(a for a in node.args if isinstance(a, dict))
        assert options.get("BACKEND") == "TRITON", (node.target, options)
        captured = node.args[-1]  # mask_mod_other_buffers
        assert captured, node.target
        tensors = [b for b in captured if isinstance(b.meta.get("val"), torch.Tensor)]
        assert tensors, node.target  # the rest are the symbolic sizes dynamic shapes lift in
        for buffer in tensors:
            assert buffer.op == "call_function" and "materialize" in str(buffer.target), (node.target, buffer)


# ------------------------------------------------------------ the block mask


@st.composite
def mask_case(draw):
    lengths = draw(st.lists(st.integers(1, 300), min_size=1, max_size=4))
    num_blocks, num_diag = draw(st.integers(1, 2)), draw(st.integers(0, 2))
    offset = draw(st.integers(0, 2))
    visible = draw(st.sampled_from(["none", "all", "random"]))
    return lengths, num_blocks, num_diag, offset, visible, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=15)
@given(case=mask_case())
def test_block_mask_covers_the_rule(case):
    """Pair by pair, from the mask_mod (the rule) itself: every visible pair is in a
    kept (partial or full) block, and a full block has every pair visible."""
    lengths, num_blocks, num_diag, offset, visible, seed = case
    num_rows = sum(lengths)
    gen = torch.Generator().manual_seed(seed)
    q = torch.zeros(num_blocks, num_rows, 1, 16)
    ctx = torch.zeros(num_rows, 1, 16)
    diag = torch.zeros(num_diag, num_rows, 1, 16) if num_diag else None
    seq_id = torch.tensor([i for i, n in enumerate(lengths) for _ in range(n)])
    mask = None
    if num_diag and visible != "none":
        mask = torch.rand(num_blocks, num_diag, num_rows, generator=gen) < (0.5 if visible == "random" else 2.0)
    captured = {}

    def spy(*args, **kwargs):
        captured["block_mask"] = kwargs["block_mask"]
        return torch.zeros(1, args[0].shape[1], args[0].shape[2], 16)

    import torch.nn.attention.flex_attention as flex_module

    real = flex_module.flex_attention
    flex_module.flex_attention = spy
    try:
        flex_chain_attention(q, ctx, ctx, diag, diag, seq_id, offset, mask, 1.0)
    finally:
        flex_module.flex_attention = real
    block_mask = captured["block_mask"]
    num_q, num_kv = block_mask.seq_lengths
    q_index = torch.arange(num_q)[:, None]
    kv_index = torch.arange(num_kv)[None, :]
    rule = block_mask.mask_mod(0, 0, q_index, kv_index)  # [num_q, num_kv]
    # Only the real rows of the rule matter: padding rows are cut from the output.
    padded = num_q // num_blocks
    real_q = (q_index % padded < num_rows).expand_as(rule)
    rule = rule & real_q
    blocks = rule.view(num_q // BLOCK, BLOCK, num_kv // BLOCK, BLOCK)
    any_visible = blocks.any(3).any(1)
    all_visible = (blocks | ~real_q.view_as(blocks)).all(3).all(1)

    def dense(num, indices):
        out = torch.zeros(num.shape[-1], indices.shape[-1], dtype=torch.bool)
        for row in range(num.shape[-1]):
            out[row, indices[0, 0, row, : num[0, 0, row]].long()] = True
        return out

    partial = dense(block_mask.kv_num_blocks, block_mask.kv_indices)
    full = dense(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    assert not (partial & full).any()
    assert not (any_visible & ~(partial | full)).any(), "a visible pair outside every kept block"
    assert not (full & ~all_visible).any(), "a full block with a masked pair"
    # The backward's per-key-block lists are the transpose of the same blocks.
    assert torch.equal(dense(block_mask.q_num_blocks, block_mask.q_indices), partial.T)
    assert torch.equal(dense(block_mask.full_q_num_blocks, block_mask.full_q_indices), full.T)


# ------------------------------------------------------------ CUDA


@pytest.mark.cuda
def test_compiled_training_across_sequence_counts_cuda():
    """On CUDA with dynamic=True: the training loss through the fused flex kernel,
    forward and backward, at 1, 2 and 8 sequences (one of them shorter than a
    block), gradients equal to eager dense, and one compile for all three."""
    import copy

    from specdraft.models import MTPHead

    from fixtures.draft_heads import draft_config

    torch.manual_seed(0)
    head = MTPHead(draft_config(False, hidden_size=64, num_heads=4, num_kv_heads=2, n_predict=3)).cuda()
    eager_head = copy.deepcopy(head)

    def loss_fn(h, packed, attention):
        out = unroll(h, *packed.unroll_args(), num_steps=3, tokens="draft", loop="multi_layer", attention=attention)
        return (torch.logsumexp(out.logits.float(), -1) * out.valid).sum()

    compiled = fresh_compile(loss_fn, fullgraph=True, dynamic=True)
    with CompileCounts.measure() as counts:
        for seed, lengths in enumerate([[300], [37, 190], [40, 5, 60, 33, 71, 12, 90, 130]]):
            packed = make_packed(lengths, target_hidden=64, mrope=False, seed=seed, device="cuda")
            want = loss_fn(eager_head, packed, "dense")
            want.backward()
            got = compiled(head, packed, "auto")
            got.backward()
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            for (name, p), q in zip(head.named_parameters(), eager_head.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=f"{lengths} {name}")
            head.zero_grad(set_to_none=True)
            eager_head.zero_grad(set_to_none=True)
    assert counts.graph_breaks == 0 and counts.compiles == 1
