"""torch.compile(spec.propose, fullgraph=True) of the AutoregressiveSpeculator equals
eager (draft tokens identical, logits buffer and KV caches allclose) with no graph
break, for {1-D, M-RoPE} x {advancing, constant positions}; decode alone compiles
too; with dynamic=True one compile serves batch sizes 3 and 17.

The matrix compiles with backend="aot_eager" (Dynamo + AOT functionalization of
every custom op, no Inductor codegen) to stay within CI time on 2 cores; one
representative case compiles with Inductor.
"""

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.models import TinyTargetModel
from specdraft.proposers import AutoregressiveSpeculator, DraftLM
from specdraft.testing import CompileCounts, fresh_compile
from specdraft.testing.proposers import make_draft_batch

from fixtures.draft_heads import VOCAB, draft_config

BLOCK_SIZE = 4
BLOCKS = 8
K = 3
QUERY_LENS = [5, 1, 9, 3]


def make_spec(mrope, advance, num_reqs, device, seed=0):
    torch.manual_seed(seed)
    lm = TinyTargetModel(draft_config(mrope, num_layers=2)).eval().to(device)
    config = SpeculativeConfig(
        num_speculative_tokens=K,
        max_model_len=256,
        block_size=BLOCK_SIZE,
        draft_sampling="probabilistic",
        return_probs="logits",
    )
    kv = lm.allocate_kv_caches(num_reqs * BLOCKS, BLOCK_SIZE, device=device)
    for cache in kv:
        cache.copy_(torch.randn(cache.shape, generator=torch.Generator().manual_seed(5)).to(device))
    return AutoregressiveSpeculator(DraftLM(lm), config, kv, advance_draft_positions=advance)


def make_batch(query_lens, mrope, device, seed=0):
    return make_draft_batch(
        query_lens,
        vocab_size=VOCAB,
        target_hidden_size=8,
        block_size=BLOCK_SIZE,
        blocks_per_request=BLOCKS,
        mrope=mrope,
        temperatures=[0.5 + (b % 3) * 0.5 if b % 4 else 0.0 for b in range(len(query_lens))],
        seed=seed,
        device=device,
    )


def args_of(batch):
    return (batch.target_token_ids, batch.target_positions, None, batch.next_token_ids, batch.metadata, batch.sampling)


def twin(spec):
    """The same speculator on a copy of its caches (compiled and eager both write)."""
    return AutoregressiveSpeculator(
        spec.model,
        spec.config,
        [c.clone() for c in spec.kv_caches],
        advance_draft_positions=spec.advance_draft_positions,
    )


def assert_same(eager_spec, eager_out, compiled_spec, compiled_out):
    assert torch.equal(compiled_out.draft_tokens, eager_out.draft_tokens)
    torch.testing.assert_close(compiled_out.draft_probs, eager_out.draft_probs, rtol=1e-4, atol=1e-4)
    for a, b in zip(eager_spec.kv_caches, compiled_spec.kv_caches, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def check_fullgraph(device, mrope, advance, backend, rejected=None):
    eager_spec = make_spec(mrope, advance, len(QUERY_LENS), device)
    compiled_spec = twin(eager_spec)
    batch = make_batch(QUERY_LENS, mrope, device)
    kwargs = {} if rejected is None else {"num_rejected_tokens": torch.tensor(rejected, dtype=torch.int32).to(device)}
    with torch.no_grad():
        eager_out = eager_spec.propose(*args_of(batch), **kwargs)
        compiled = fresh_compile(compiled_spec.propose, fullgraph=True, backend=backend)
        with CompileCounts.measure() as counts:
            compiled_out = compiled(*args_of(batch), **kwargs)
    assert counts.graph_breaks == 0 and counts.compiles == 1, counts
    assert_same(eager_spec, eager_out, compiled_spec, compiled_out)


@pytest.mark.parametrize("advance", [True, False], ids=["advance", "constant"])
@pytest.mark.parametrize("mrope", [False, True], ids=["1d", "mrope"])
def test_fullgraph_equals_eager_aot(device, mrope, advance):
    check_fullgraph(device, mrope, advance, "aot_eager", rejected=[2, 0, 3, 1] if advance else None)


def test_fullgraph_equals_eager_inductor(device):
    check_fullgraph(device, mrope=True, advance=True, backend="inductor", rejected=[2, 0, 3, 1])


def test_decode_alone_compiles(device):
    eager_spec = make_spec(False, True, len(QUERY_LENS), device)
    compiled_spec = twin(eager_spec)
    batch = make_batch(QUERY_LENS, False, device)
    with torch.no_grad():
        eager_out = eager_spec.propose(*args_of(batch))
        state = compiled_spec.prefill(*args_of(batch))
        decode = fresh_compile(compiled_spec.decode, fullgraph=True, backend="aot_eager")
        with CompileCounts.measure() as counts:
            compiled_out = decode(state)
    assert counts.graph_breaks == 0 and counts.compiles == 1, counts
    assert_same(eager_spec, eager_out, compiled_spec, compiled_out)


def test_dynamic_batch_sizes_compile_once(device):
    """B = 1, 3, 17, 64 through one graph, with the settings an engine uses (as in
    test_eagle_compile.py): size-oblivious backed sizes (else B = 1 specializes)
    and no duck sizing (else B + 1 = 4 ties to the caches' block size 4). Every batch
    has the same longest window: max_query_len is a Python int, so a guard."""
    sizes = [[9], [5, 1, 9], [9, 1, 5, 3, 7, 2, 8, 4, 6, 9, 1, 2, 3, 9, 8, 7, 9], [1 + b % 9 for b in range(64)]]
    spec = make_spec(False, True, 64, device)
    compiled = fresh_compile(spec.propose, fullgraph=True, dynamic=True, backend="aot_eager")
    eager_spec = twin(spec)
    with (
        torch.fx.experimental._config.patch(backed_size_oblivious=True, use_duck_shape=False),
        CompileCounts.measure() as counts,
        torch.no_grad(),
    ):
        for query_lens in sizes:
            batch = make_batch(query_lens, False, device, seed=len(query_lens))
            got = compiled(*args_of(batch))
            want = eager_spec.propose(*args_of(batch))
            assert torch.equal(got.draft_tokens, want.draft_tokens), len(query_lens)
            torch.testing.assert_close(got.draft_probs, want.draft_probs, rtol=1e-4, atol=1e-4)
    assert counts.graph_breaks == 0 and counts.compiles == 1 and counts.restarts == 0, counts
