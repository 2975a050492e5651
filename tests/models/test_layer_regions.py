"""The target model's layers as nested compile regions (inside
models.regions.layer_regions(), as SpeculativeDecoder's compiled calls run): the
compiled forward equals eager,
and its graph holds one compiled copy of a layer's pieces whatever the depth, which
is what keeps the 32-layer cold compile near a 2-layer one (benchmarks/README.md,
"By target depth"). Graph-structure checks on the CPU stand in for the CUDA compile
they predict."""

import pytest
import torch

from specdraft.generation.verify import prompt_batch
from specdraft.models import DraftModelConfig, TinyTargetModel
from specdraft.models.regions import in_layer_regions

BLOCK = 4


def target(layers):
    torch.manual_seed(0)
    config = DraftModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2,
                              head_dim=8, num_layers=layers)  # fmt: skip
    return TinyTargetModel(config)


def run(model, layer_regions, backend=None, dynamic=False):
    caches = model.allocate_kv_caches(16, BLOCK)
    prompts = [torch.arange(5) % 64, torch.arange(3, 10) % 64]
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    ids, positions, metadata, _ = prompt_batch(prompts, table, BLOCK, 16)

    def forward(ids, positions):
        return model(ids, positions, metadata, caches, aux_layers=(0, 1))

    fn = forward if backend is None else torch.compile(forward, fullgraph=True, dynamic=dynamic, backend=backend)
    if layer_regions:
        fn = in_layer_regions(fn)
    with torch.no_grad():
        return fn(ids, positions), caches


def graphs_of(model, layer_regions=True, dynamic=False):
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    run(model, layer_regions, record, dynamic)
    return graphs


@pytest.mark.parametrize("layers", [2, 5])
def test_compiled_forward_with_layer_regions_equals_eager(layers):
    model = target(layers)
    (want, want_aux), want_caches = run(model, False)
    (got, got_aux), got_caches = run(model, True, "aot_eager")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_aux, want_aux, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_caches, want_caches, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def count_calls(gm):
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and "invoke_subgraph" in str(n.target)]
    bodies = {n.args[0].target for n in calls}
    return len(calls), len(bodies)


def test_one_compiled_layer_whatever_the_depth():
    (shallow,) = graphs_of(target(2))
    (deep,) = graphs_of(target(6))
    calls_2, bodies_2 = count_calls(shallow)
    calls_6, bodies_6 = count_calls(deep)
    # Each layer calls the same three bodies (before attention, attention, after it).
    assert (calls_2, calls_6) == (6, 18)
    assert bodies_2 == bodies_6 == 3
    # Outside the regions a layer keeps its cache write, its weights as inputs and the
    # region calls: four more layers grow the graph by less than half of what they
    # add with only the attention and the MLP as regions (the norms, projections and
    # RoPE traced per layer).
    grown = len(deep.graph.nodes) - len(shallow.graph.nodes)
    (plain_shallow,) = graphs_of(target(2), layer_regions=False)
    (plain_deep,) = graphs_of(target(6), layer_regions=False)
    plain_grown = len(plain_deep.graph.nodes) - len(plain_shallow.graph.nodes)
    assert grown < plain_grown / 2, f"{grown} more nodes for four more layers, {plain_grown} without layer regions"


def test_switch_is_guarded():
    """A graph traced inside layer_regions() is not reused outside it, nor the other
    way round: Dynamo guards on the switch (the decoder's compiled calls always run
    inside it; a dynamic-shape compile of the same code must never see it on)."""
    from specdraft.models import regions

    def read(x):
        return x + 1 if regions.layer_regions_on() else x - 1

    compiled = torch.compile(read, fullgraph=True, backend="eager")
    x = torch.zeros(2)
    with regions.layer_regions():
        inside = compiled(x)
    outside = compiled(x)
    assert inside.tolist() == [1.0, 1.0] and outside.tolist() == [-1.0, -1.0]


def test_a_dynamic_trace_inlines_every_region():
    """Under torch.compile(dynamic=True) no region is kept (models.regions.
    tracing_dynamic_shapes): torch 2.11's Inductor failed to compile the paged-attention
    region of a dynamic 8B-shaped propose on CUDA (a buffer sized by a symbol the
    region never receives). The static trace of the same forward keeps its regions,
    so this check can fail."""
    model = target(2)
    (static,) = graphs_of(model, layer_regions=False)
    (dynamic,) = graphs_of(model, layer_regions=False, dynamic=True)
    assert count_calls(static)[0] > 0
    assert count_calls(dynamic) == (0, 0)
