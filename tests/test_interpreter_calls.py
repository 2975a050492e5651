"""The interpreter lane's faster nested calls (fixtures/interpreter_calls.py) change
no result: kernels whose helpers call each other and triton.language.standard's
functions (the truncation search, draft sampling) give bit-identical outputs with
the fast path and with the interpreter's own calls, and the fast path is taken."""

import pytest
import torch

from specdraft.ops import draft_sample, truncation_cut

from fixtures import interpreter_calls


def inputs(seed: int = 5, rows: int = 6, vocab: int = 100):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(torch.bfloat16).float()
    temperature = torch.tensor([1.0, 0.7, 1.3, 1.0, 0.5, 2.0])
    top_k = torch.tensor([0, 20, 0, 5, 50, 0], dtype=torch.int64)
    top_p = torch.tensor([0.9, 1.0, 0.5, 0.95, 0.99, 1.0])
    min_p = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.2, 0.1])
    return logits, temperature, top_k, top_p, min_p


@pytest.mark.interpreter
def test_fast_nested_calls_give_the_interpreters_results():
    logits, temperature, top_k, top_p, min_p = inputs()
    seeds, positions = torch.arange(6, dtype=torch.int64), torch.arange(6, dtype=torch.int64) * 7
    skipped = interpreter_calls.SKIPPED[0]
    fast_cut = truncation_cut(logits, temperature, top_k, top_p, min_p)
    fast_tokens = draft_sample(logits, temperature, seeds, positions, logit_cut=fast_cut)
    assert interpreter_calls.SKIPPED[0] > skipped  # the fast path ran
    with interpreter_calls.uninstalled():
        skipped = interpreter_calls.SKIPPED[0]
        cut = truncation_cut(logits, temperature, top_k, top_p, min_p)
        tokens = draft_sample(logits, temperature, seeds, positions, logit_cut=cut)
        assert interpreter_calls.SKIPPED[0] == skipped  # the interpreter's own calls
    assert torch.equal(fast_cut, cut) and torch.equal(fast_tokens, tokens)
    assert bool((cut > float("-inf")).all())  # every row was truncated: the searches ran
