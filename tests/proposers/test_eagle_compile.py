"""torch.compile(proposer.propose, fullgraph=True) equals eager, with no graph
break, for EagleProposer x {greedy, probabilistic} x {1-D, M-RoPE} x {plain,
padded, unpadded, parallel drafting}; with dynamic=True, one compile serves batch
sizes 1, 3, 17, 64.

The matrix (pairwise in CI, whole nightly: tests/fixtures/matrix.py) compiles with backend="aot_eager" (Dynamo fullgraph tracing plus AOT
functionalization of every custom op: everything but Inductor's codegen), which
keeps this suite within CI's time on 2 cores; representative cases compile with
Inductor too.
"""

import re

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.proposers import EagleProposer
from specdraft.testing import CompileCounts, fresh_compile
from specdraft.testing.proposers import make_draft_batch

from fixtures.draft_heads import VOCAB, make_head
from fixtures.matrix import case_ids, pairwise

BLOCK_SIZE = 4


def setup(method, sampling, mrope, query_lens, device, seed=0, k=3, parallel=False):
    head, target_hidden = make_head(method, mrope, seed)
    head = head.to(device)
    batch = make_draft_batch(
        query_lens,
        vocab_size=VOCAB,
        target_hidden_size=target_hidden,
        block_size=BLOCK_SIZE,
        blocks_per_request=8,
        mrope=mrope,
        temperatures=[0.5 + (b % 3) * 0.5 if b % 4 else 0.0 for b in range(len(query_lens))],
        seed=seed,
        device=device,
    )
    config = SpeculativeConfig(
        method=method,
        num_speculative_tokens=k,
        max_model_len=256,
        block_size=BLOCK_SIZE,
        draft_sampling=sampling,
        return_probs="probs" if sampling == "probabilistic" else None,
        parallel_drafting=parallel,
        parallel_drafting_token_id=7 if parallel else None,
    )
    num_blocks = len(query_lens) * 8
    return head, batch, config, num_blocks


def call(proposer, path, batch):
    rejected = torch.tensor(
        [b % 2 for b in range(batch.metadata.num_reqs)], dtype=torch.int32, device=batch.next_token_ids.device
    )
    if path in ("plain", "parallel"):
        return proposer.propose(*batch.propose_args(), num_rejected_tokens=rejected if path == "parallel" else None)
    if path == "padded":
        return proposer.propose(
            *batch.propose_args(),
            token_indices_to_sample=batch.metadata.query_start_loc[1:] - 1 - rejected,
            num_rejected_tokens=rejected,
        )
    args = batch.propose_args()
    return proposer.propose_unpadded(
        *args[:4], rejected, batch.metadata, num_kept_tokens=batch.target_token_ids.shape[0], sampling=batch.sampling
    )


def run_both(method, sampling, mrope, path, device, backend, k=3, num_blocks=None):
    """The compiled call equals the eager one. With backend="inductor", returns the
    generated code and the first KV cache's element count (run_and_get_code reads
    the code on an FX-graph cache hit too)."""
    head, batch, config, batch_blocks = setup(
        method, sampling, mrope, [5, 2, 7, 3], device, k=k, parallel=path == "parallel"
    )
    num_blocks = num_blocks or batch_blocks
    eager = EagleProposer(head, config, head.allocate_kv_caches(num_blocks, BLOCK_SIZE, device=device))
    compiled = EagleProposer(head, config, head.allocate_kv_caches(num_blocks, BLOCK_SIZE, device=device))
    code = None
    with torch.no_grad():
        want = call(eager, path, batch)
        fn = fresh_compile(lambda *a, **kw: call(compiled, path, batch), fullgraph=True, backend=backend)
        with CompileCounts.measure() as counts:
            if backend == "inductor":
                from torch._inductor.utils import run_and_get_code

                got, code = run_and_get_code(fn)
            else:
                got = fn()
    assert torch.equal(got.draft_tokens, want.draft_tokens)
    if sampling == "probabilistic":
        torch.testing.assert_close(got.draft_probs, want.draft_probs, rtol=1e-4, atol=1e-5)
    for a, b in zip(eager.kv_caches, compiled.kv_caches, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1
    return code and ("\n".join(code), compiled.kv_caches[0].numel())


# Pairwise in CI (12 of the 48 cases; fixtures/matrix.py), the whole product nightly.
MATRIX = pairwise(["eagle", "eagle3", "mtp"], ["greedy", "probabilistic"], [False, True],
                  ["plain", "padded", "unpadded", "parallel"])  # fmt: skip


@pytest.mark.parametrize("method, sampling, mrope, path", MATRIX, ids=case_ids(MATRIX))
def test_fullgraph_matrix_aot_eager(device, method, sampling, mrope, path):
    run_both(method, sampling, mrope, path, device, backend="aot_eager")


# 101 cache blocks (the batch uses 32): a whole-cache kernel's extent is a number no
# other buffer of these graphs has.
INDUCTOR_CACHE_BLOCKS = 101


@pytest.mark.parametrize(
    "method, sampling, mrope, path",
    [("eagle3", "probabilistic", True, "padded"), ("eagle", "greedy", False, "unpadded")],
)
def test_fullgraph_inductor(device, method, sampling, mrope, path):
    """Inductor's graph equals eager, and it writes the KV cache in place: the
    compiled loop scatters its new keys and values into the cache; it must not
    rebuild the cache and copy all of it back (what Inductor does with a mutation of
    a reshaped view of an input), a full-cache copy per propose call. A kernel's
    extent is `xnumel = N` (Triton) or a loop bound `static_cast<int64_t>(NL)` (C++);
    a whole-cache kernel has the cache's element count there. One compile serves
    both checks; the plain path (the decoder's call) compiles with Inductor in
    tests/test_demo.py's compiled demo."""
    # K = 2: one first pass and one draft step exercise every piece of the loop;
    # each extra step only adds an unrolled copy (and Inductor compile time).
    code, whole_cache = run_both(
        method, sampling, mrope, path, device, backend="inductor", k=2, num_blocks=INDUCTOR_CACHE_BLOCKS
    )
    assert "def call" in code or "def run" in code, "no generated code captured"
    extent = rf"xnumel = {whole_cache}\b|static_cast<int64_t>\({whole_cache}L\)"
    assert re.search(extent, code) is None, f"a kernel loops over the whole cache ({whole_cache} elements)"


@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "parallel"])
def test_dynamic_batch_sizes_compile_once(device, parallel):
    """Batch sizes 1, 3, 17, 64 through one dynamic graph. Two settings make that
    possible, and an engine wants both: size-oblivious reasoning for backed sizes
    (else B = 1 is specialized and recompiles), and no duck sizing (else B = 3
    equals K = 3 and the graph guards on B == K)."""
    head, _, config, _ = setup("eagle", "probabilistic", False, [1], device, parallel=parallel)
    kv = head.allocate_kv_caches(64 * 8, BLOCK_SIZE, device=device)
    proposer = EagleProposer(head, config, kv)
    with (
        torch.fx.experimental._config.patch(backed_size_oblivious=True, use_duck_shape=False),
        torch.no_grad(),
    ):
        fn = fresh_compile(proposer.propose, fullgraph=True, dynamic=True, backend="aot_eager")
        with CompileCounts.measure() as counts:
            for num_reqs in (1, 3, 17, 64):
                _, batch, _, _ = setup("eagle", "probabilistic", False, [2 + b % 5 for b in range(num_reqs)], device)
                got = fn(*batch.propose_args())
                want = proposer.propose(*batch.propose_args())
                assert torch.equal(got.draft_tokens, want.draft_tokens), num_reqs
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"{counts.compiles} graphs for 4 batch sizes"
    assert counts.restarts == 0, "a float attribute (theta, eps, ...) made Dynamo trace propose twice"
