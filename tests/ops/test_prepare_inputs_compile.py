"""opcheck for the prepare-inputs ops; the whole after-rejection preparation (next
tokens -> padded metadata -> packed indices) compiled with fullgraph=True equals
eager, with no graph break, and with dynamic=True compiles once for several batch
sizes."""

import pytest
import torch

from specdraft.ops import prepare_eagle_input, prepare_inputs_padded, prepare_next_token_padded
from specdraft.testing import CompileCounts, RejectionLayout, fresh_compile

VOCAB = 1000
K = 3


def layout_of(batch: int) -> RejectionLayout:
    """Decode requests with K drafts and some accepted, mixed with prefill chunks."""
    prefill = [b % 4 == 2 for b in range(batch)]
    return RejectionLayout(
        query_lens=[(40 + b if p else K + 1) for b, p in enumerate(prefill)],
        num_draft_tokens=[0 if p else K for p in prefill],
        valid_counts=[1 if p else 1 + (b * 5) % (K + 1) for b, p in enumerate(prefill)],
    )


def inputs(layout: RejectionLayout, device) -> dict:
    gen = torch.Generator().manual_seed(layout.num_reqs)
    meta = layout.tensors(device)
    rows = torch.full((layout.num_reqs, K + 1), -1, dtype=torch.int32)
    for b, v in enumerate(layout.valid_counts):
        rows[b, :v] = torch.randint(0, VOCAB, (v,), generator=gen, dtype=torch.int32)
    rows[::5, -1] = VOCAB + 3  # an invalid id past the vocabulary
    return {
        "sampled_token_ids": rows.to(device),
        "discard_request_mask": (torch.arange(layout.num_reqs) % 7 == 3).to(device),
        "backup_next_token_ids": torch.randint(0, VOCAB, (layout.num_reqs,), generator=gen, dtype=torch.int32).to(
            device
        ),
        "cu_num_draft_tokens": meta["cu_num_draft_tokens"],
        "query_start_loc": meta["query_start_loc"],
        # An upper bound the host knows without a sync: every scheduled token.
        "num_tokens": sum(layout.query_lens),
    }


def prepare(sampled_token_ids, discard_request_mask, backup_next_token_ids, cu_num_draft_tokens, query_start_loc,
            num_tokens: int):  # fmt: skip
    nxt = prepare_next_token_padded(sampled_token_ids, discard_request_mask, backup_next_token_ids, VOCAB)
    padded = prepare_inputs_padded(cu_num_draft_tokens, nxt.valid_sampled_tokens_count, query_start_loc)
    packed = prepare_eagle_input(query_start_loc, padded.num_rejected_tokens, num_tokens)
    return (*nxt, *padded, *packed)


def assert_same(eager_out, compiled_out):
    for a, b in zip(eager_out, compiled_out, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_opcheck_every_op(device):
    layout = layout_of(6)
    t = inputs(layout, device)
    meta = layout.tensors(device)
    torch.library.opcheck(
        torch.ops.specdraft.prepare_next_token_padded,
        (t["sampled_token_ids"], t["discard_request_mask"], t["backup_next_token_ids"], VOCAB),
    )
    torch.library.opcheck(
        torch.ops.specdraft.prepare_inputs_padded,
        (meta["cu_num_draft_tokens"], meta["valid_sampled_tokens_count"], meta["query_start_loc"]),
    )
    for num_tokens in (layout.num_kept_tokens, t["num_tokens"]):
        torch.library.opcheck(
            torch.ops.specdraft.prepare_eagle_input,
            (meta["query_start_loc"], meta["num_rejected_tokens"], num_tokens),
        )


def test_fullgraph_equals_eager_without_graph_breaks(device):
    t = inputs(layout_of(10), device)
    eager_out = prepare(**t)
    compiled = fresh_compile(prepare, fullgraph=True)
    with CompileCounts.measure() as counts:
        compiled_out = compiled(**t)
    assert_same(eager_out, compiled_out)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1


def test_dynamic_shapes_compile_once_across_batch_sizes(device):
    compiled = fresh_compile(prepare, fullgraph=True, dynamic=True)
    with CompileCounts.measure() as counts:
        for batch in (5, 9, 17):  # B, B+1 and the token count never equal K+1 = 4 or each other
            t = inputs(layout_of(batch), device)
            assert_same(prepare(**t), compiled(**t))
    assert counts.graph_breaks == 0
    assert counts.compiles == 1, f"recompiled: {counts.compiles} graphs for 3 batch sizes"


@pytest.mark.parametrize("batch", [0, 1])
def test_fullgraph_tiny_batches(device, batch):
    t = inputs(layout_of(batch), device)
    assert_same(prepare(**t), fresh_compile(prepare, fullgraph=True)(**t))
