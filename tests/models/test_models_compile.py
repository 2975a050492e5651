"""Every draft head and the tiny target model compiled with fullgraph=True equal
eager (outputs and KV-cache writes), with no graph break and one compile; an EAGLE
step with dynamic=True compiles once across batch sizes; on CUDA, the bf16 forward
under mode="reduce-overhead" (CUDA graphs) matches eager within bf16 tolerance."""

import pytest
import torch

from specdraft.models import (
    BatchMetadata,
    DraftModelConfig,
    Eagle3Head,
    EagleHead,
    MTPHead,
    TinyTargetModel,
    default_aux_layers,
    linear,
)
from specdraft.testing import CompileCounts, fresh_compile

from fixtures.traced_calls import traced_calls

CFG = DraftModelConfig(
    hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8, vocab_size=67, draft_vocab_size=29
)
BLOCK, WIDTH = 4, 7


def metadata(lens, device, context=0):
    """Each request has `context` cached tokens plus len new ones; a PAD token at the end."""
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    table = [[b * WIDTH + i for i in range(WIDTH)] for b in range(len(lens))]
    slots = [table[b][p // BLOCK] * BLOCK + p % BLOCK for b, n in enumerate(lens) for p in range(context, context + n)]
    pos = [p for n in lens for p in range(context, context + n)] + [0]
    md = BatchMetadata(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor([context + n for n in lens], dtype=torch.int32, device=device),
        block_table=torch.tensor(table, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots + [-1], dtype=torch.int64, device=device),
        max_query_len=9,
    )
    return md, torch.tensor(pos, device=device)


def make(kind, device, dtype=torch.float32):
    torch.manual_seed(0)
    cfg = CFG.with_dtype(dtype)
    if kind == "eagle":
        model = EagleHead(cfg)
    elif kind == "eagle3":
        model = Eagle3Head(cfg)
        model.d2t.copy_(torch.arange(cfg.draft_vocab_size) * 2 - torch.arange(cfg.draft_vocab_size))
    elif kind == "mtp":
        model = MTPHead(DraftModelConfig(**{**cfg.__dict__, "n_predict": 2, "extra": {}}), per_layer_lm_head=True)
    else:
        model = TinyTargetModel(cfg)
    return model.to(device).eval()


def step_fn(model, kind):
    """One forward + logits, as a proposer step calls it."""
    if kind == "target":

        def fn(ids, pos, hidden, md, caches):
            h, aux = model(ids, pos, md, caches, aux_layers=default_aux_layers(1))
            return model.compute_logits(h), aux

        return fn
    step = 1 if kind == "mtp" else 0

    def fn(ids, pos, hidden, md, caches):
        out, nxt = model(ids, pos, hidden, md, caches, spec_step_idx=step)
        return model.compute_logits(out, spec_step_idx=step), nxt

    return fn


def inputs(model, kind, lens, device, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    md, pos = metadata(lens, device, context=3)
    t = pos.shape[0]
    width = 3 * CFG.hidden_size if kind == "eagle3" else CFG.hidden_size
    caches = [
        torch.randn(c.shape, generator=g).to(device, dtype) for c in model.allocate_kv_caches(len(lens) * WIDTH, BLOCK)
    ]
    ids = torch.randint(0, CFG.vocab_size, (t,), generator=g, dtype=torch.int32).to(device)
    return ids, pos, torch.randn(t, width, generator=g).to(device, dtype), md, caches


def clone(args):
    ids, pos, hidden, md, caches = args
    return ids, pos, hidden, md, [c.clone() for c in caches]


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "mtp", "target"])
def test_fullgraph_equals_eager(device, kind):
    check_fullgraph_equals_eager(device, kind)


@pytest.mark.parametrize("kind", ["eagle3", "target"])
def test_fullgraph_equals_eager_with_small_linears_as_reductions(monkeypatch, device, kind):
    """The demo pair's kinds with SPECDRAFT_SMALL_LINEAR=reduction, on this lane's
    device as on CUDA: 16 rows (15 tokens and the pad), so every projection is a
    reduction (models/linear.py), which the Dynamo graph shows."""
    monkeypatch.setattr(linear, "SMALL_LINEAR_FORM", "reduction")
    monkeypatch.setattr(linear, "REDUCTION_DEVICES", ("cuda", torch.device(device).type))
    lens = [4, 2, 9]
    check_fullgraph_equals_eager(device, kind, lens)
    model = make(kind, device)
    with torch.no_grad():
        calls, _ = traced_calls(step_fn(model, kind), *inputs(model, kind, lens, device))
    assert not any("linear" in call for call in calls) and "sum" in calls, calls


def check_fullgraph_equals_eager(device, kind, lens=(5, 2, 9)):
    model = make(kind, device)
    eager_in = inputs(model, kind, list(lens), device)
    compiled_in = clone(eager_in)
    with torch.no_grad():
        want = step_fn(model, kind)(*eager_in)
        compiled = fresh_compile(step_fn(model, kind), fullgraph=True)
        with CompileCounts.measure() as counts:
            got = compiled(*compiled_in)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for a, b in zip(compiled_in[4], eager_in[4], strict=True):  # the cache writes agree
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1


def test_dynamic_batch_sizes_compile_once(device):
    model = make("eagle", device)
    compiled = fresh_compile(step_fn(model, "eagle"), fullgraph=True, dynamic=True)
    with torch.no_grad(), CompileCounts.measure() as counts:
        # 5, 6, 9 requests. Duck sizing ties equal sizes at the first compile: the first
        # batch avoids every other dim (B + 1 = 6, T = 21, cache blocks 35).
        for lens in ([5, 3, 6, 2, 4], [2, 9, 4, 3, 7, 5], [6, 6, 3, 5, 2, 8, 4, 3, 7]):
            eager_in = inputs(model, "eagle", lens, device)
            compiled_in = clone(eager_in)
            want = step_fn(model, "eagle")(*eager_in)
            got = compiled(*compiled_in)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"recompiled: {counts.compiles} graphs for 3 batch sizes"
    assert counts.restarts == 0, "a float attribute (theta, eps, ...) made Dynamo trace the step twice"


class CachedStep(torch.nn.Module):
    """The KV caches as buffers: CUDA-graph trees take buffers as static inputs, so
    writing them in place does not make torch.compile skip the graph (mutating a
    plain argument would)."""

    def __init__(self, model, kind, caches):
        super().__init__()
        self.model, self.kind = model, kind
        for i, c in enumerate(caches):
            self.register_buffer(f"cache{i}", c)

    def forward(self, ids, pos, hidden, md):
        caches = [getattr(self, f"cache{i}") for i in range(self.model.num_kv_layers)]
        return step_fn(self.model, self.kind)(ids, pos, hidden, md, caches)


def test_cuda_bf16_reduce_overhead_matches_eager(device):
    if device != "cuda":
        pytest.skip("CUDA graphs (mode='reduce-overhead') need a CUDA device; run with SPECDRAFT_DEVICE=cuda")
    from torch._dynamo.utils import counters

    model = make("eagle3", device, torch.bfloat16)
    first = inputs(model, "eagle3", [5, 2, 9], device, torch.bfloat16, seed=1)
    eager_step, graph_step = CachedStep(model, "eagle3", clone(first)[4]), CachedStep(model, "eagle3", clone(first)[4])
    compiled = fresh_compile(graph_step, fullgraph=True, mode="reduce-overhead")
    skips_before = counters["inductor"]["cudagraph_skips"]
    with torch.no_grad():
        for seed in (1, 2, 3):  # warm-up, capture, replay; caches accumulate in both steps alike
            ids, pos, hidden, md, _ = inputs(model, "eagle3", [5, 2, 9], device, torch.bfloat16, seed)
            want = eager_step(ids, pos, hidden, md)
            got = [t.clone() for t in compiled(ids, pos, hidden, md)]
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(graph_step.cache0.float(), eager_step.cache0.float(), rtol=2e-2, atol=5e-2)
    assert counters["inductor"]["cudagraph_skips"] == skips_before, "torch.compile skipped CUDA graphs"
