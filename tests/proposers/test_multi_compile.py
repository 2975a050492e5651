"""torch.compile(proposer.propose, fullgraph=True) equals eager for
MultiLayerEagleProposer and MultiGroupMTPProposer (tokens identical, probs close,
KV caches and the shift cache close), with no graph break and one compile; with
dynamic=True one graph serves batch sizes 1, 3, 17 and 64.

The greedy/probabilistic x 1-D/M-RoPE matrix (pairwise in CI, whole nightly:
tests/fixtures/matrix.py) compiles with backend="aot_eager"
(Dynamo fullgraph tracing plus AOT functionalization of every custom op, including
the in-place shift-cache refresh and step_metadata), one case per proposer with
Inductor. The compiled call is a continuation with rejected tokens, after an eager
prefill call filled the shift cache, so the compiled multi-layer call really shifts.
"""

import dataclasses

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.proposers import MultiGroupMTPProposer, MultiLayerEagleProposer
from specdraft.testing import CompileCounts, fresh_compile
from specdraft.testing.proposers import make_draft_batch

from fixtures.draft_heads import VOCAB
from fixtures.matrix import case_ids, pairwise
from fixtures.multi_proposers import (
    MG_K,
    MG_LAYERS,
    ML_LAYERS,
    grouped,
    make_multi_group,
    make_multi_layer,
    mtp_head,
    multi_group_calls,
    multi_layer_calls,
    propose_by_path,
)


def to(batch, device):
    """The batch's tensors on `device` (dataclass fields, one level of lists)."""

    def move(x):
        if isinstance(x, torch.Tensor):
            return x.to(device)
        if isinstance(x, list):
            return [move(v) for v in x]
        if dataclasses.is_dataclass(x):
            return dataclasses.replace(x, **{f.name: move(getattr(x, f.name)) for f in dataclasses.fields(x)})
        return x

    return move(batch)


def moved(proposer, device):
    proposer.kv_caches[:] = [c.to(device) for c in proposer.kv_caches]
    cache = getattr(proposer, "shift_cache", None)
    if cache is not None:
        for name in ("token_ids", "positions", "hidden_states", "cached_lens", "slot_mapping"):
            setattr(cache, name, getattr(cache, name).to(device))
    proposer.model.to(device)
    return proposer


def check_same(eager, compiled, want, got, probs):
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    if probs:
        torch.testing.assert_close(got.draft_probs, want.draft_probs, rtol=1e-4, atol=1e-5)
    for a, b in zip(eager.kv_caches, compiled.kv_caches, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    if hasattr(eager, "shift_cache"):
        for name in ("token_ids", "positions", "cached_lens", "slot_mapping"):
            assert torch.equal(getattr(compiled.shift_cache, name), getattr(eager.shift_cache, name)), name
        torch.testing.assert_close(compiled.shift_cache.hidden_states, eager.shift_cache.hidden_states)


def with_probs(proposer):
    if proposer.config.draft_sampling == "probabilistic":
        proposer.config = dataclasses.replace(proposer.config, return_probs="probs")
    return proposer


def run_multi_layer(sampling, mrope, device, backend, path="padded"):
    eager = moved(with_probs(make_multi_layer(mrope, sampling)[1]), device)
    compiled = moved(with_probs(make_multi_layer(mrope, sampling)[1]), device)
    (first, _), (second, rejected) = list(multi_layer_calls(mrope, sampling))[:2]
    first, second = to(first, device), to(second, device)
    with torch.no_grad():
        for p in (eager, compiled):
            p.propose(*first.propose_args())
        want = propose_by_path(eager, second, rejected, path)
        fn = fresh_compile(lambda: propose_by_path(compiled, second, rejected, path), fullgraph=True, backend=backend)
        with CompileCounts.measure() as counts:
            got = fn()
    check_same(eager, compiled, want, got, sampling == "probabilistic")
    assert counts.graph_breaks == 0
    assert counts.compiles == 1


def run_multi_group(sampling, mrope, device, backend, path="padded"):
    eager = moved(with_probs(make_multi_group(mrope, sampling)[1]), device)
    compiled = moved(with_probs(make_multi_group(mrope, sampling)[1]), device)
    batch, rejected, _ = next(multi_group_calls(mrope, sampling))
    batch = to(batch, device)
    with torch.no_grad():
        want = propose_by_path(eager, batch, rejected, path)
        fn = fresh_compile(lambda: propose_by_path(compiled, batch, rejected, path), fullgraph=True, backend=backend)
        with CompileCounts.measure() as counts:
            got = fn()
    check_same(eager, compiled, want, got, sampling == "probabilistic")
    assert counts.graph_breaks == 0
    assert counts.compiles == 1


# Pairwise in CI (6 of the 16 cases; fixtures/matrix.py), the whole product nightly.
MATRIX = pairwise(["multi_layer", "multi_group"], ["greedy", "probabilistic"], [False, True], ["padded", "unpadded"])


@pytest.mark.parametrize("which, sampling, mrope, path", MATRIX, ids=case_ids(MATRIX))
def test_fullgraph_matrix_aot_eager(device, which, sampling, mrope, path):
    run = run_multi_layer if which == "multi_layer" else run_multi_group
    run(sampling, mrope, device, backend="aot_eager", path=path)


def test_fullgraph_inductor_multi_layer(device):
    run_multi_layer("probabilistic", True, device, backend="inductor")


def test_fullgraph_inductor_multi_group(device):
    run_multi_group("probabilistic", False, device, backend="inductor")


def dynamic_batches(sizes, device, grouped_tables=False):
    for num_reqs in sizes:
        batch = make_draft_batch(
            [2 + b % 5 for b in range(num_reqs)],
            vocab_size=VOCAB,
            target_hidden_size=32,
            block_size=4,
            blocks_per_request=8,
            temperatures=[0.5 + (b % 3) * 0.5 if b % 4 else 0.0 for b in range(num_reqs)],
            seed=num_reqs,
        )
        if grouped_tables:
            gen = torch.Generator().manual_seed(num_reqs)
            batch = grouped(batch, torch.randperm(64 * 4, generator=gen)[: num_reqs * 4].view(num_reqs, 4).int())
        yield to(batch, device)


SIZES = (1, 3, 17, 64)


def run_dynamic(make, device, grouped_tables):
    """One dynamic graph for batch sizes 1, 3, 17, 64 (all affordable on CPU with
    aot_eager). Found for the multi-layer proposer without the two patches: a graph
    traced at B = 17 serves B = 5 and B = 3, but B = 1 recompiles (0/1
    specialization): backed_size_oblivious=True fixes that. use_duck_shape=False is
    kept so that the first traced size may equal another dim (3 layers = the shift
    cache's 3 entries, K = 3) without the graph guarding on the coincidence."""
    eager, compiled = make(), make()
    with (
        torch.fx.experimental._config.patch(backed_size_oblivious=True, use_duck_shape=False),
        torch.no_grad(),
    ):
        fn = fresh_compile(compiled.propose, fullgraph=True, dynamic=True, backend="aot_eager")
        with CompileCounts.measure() as counts:
            for batch in dynamic_batches(SIZES, device, grouped_tables):
                got = fn(*batch.propose_args())
                want = eager.propose(*batch.propose_args())
                assert torch.equal(got.draft_tokens, want.draft_tokens), batch.metadata.num_reqs
                torch.testing.assert_close(got.draft_probs, want.draft_probs, rtol=1e-4, atol=1e-5)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"{counts.compiles} graphs for {len(SIZES)} batch sizes"
    assert counts.restarts == 0, "a float attribute (theta, eps, ...) made Dynamo trace propose twice"


def test_dynamic_batch_sizes_compile_once_multi_layer(device):
    def make():
        head = mtp_head(False, ML_LAYERS).to(device)
        config = SpeculativeConfig(
            method="mtp", num_speculative_tokens=ML_LAYERS, max_model_len=256, block_size=4,
            draft_sampling="probabilistic", return_probs="probs",
        )  # fmt: skip
        kv = head.allocate_kv_caches(64 * 8, 4, device=device)
        return MultiLayerEagleProposer(head, config, kv, max_num_reqs=64)

    run_dynamic(make, device, grouped_tables=False)


def test_dynamic_batch_sizes_compile_once_multi_group(device):
    def make():
        head = mtp_head(False, MG_LAYERS, per_layer_lm_head=True).to(device)
        config = SpeculativeConfig(
            method="mtp", num_speculative_tokens=MG_K, max_model_len=256, block_size=4,
            draft_sampling="probabilistic", return_probs="probs",
        )  # fmt: skip
        kv = [
            torch.zeros(head.kv_cache_shape(64 * 8, 4), device=device),
            torch.zeros(head.kv_cache_shape(64 * 4, 8), device=device),
        ]
        return MultiGroupMTPProposer(head, config, kv, layer_groups=[0, 1], block_sizes=[4, 8])

    run_dynamic(make, device, grouped_tables=True)
