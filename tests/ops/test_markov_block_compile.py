"""opcheck for markov_block_sample (each kind, fp32 and bf16 weights); a block's
three Markov heads compiled as one fullgraph=True function equal eager, with no
graph break and one compile serving several blocks."""

import torch

from specdraft.ops import markov_block_sample
from specdraft.testing import CompileCounts, fresh_compile

from fixtures.markov_block import TIE_LOGIT, MarkovCase

KINDS = ("vanilla", "gated", "rnn")


def case_of(kind: str, data_seed: int, dtype=torch.float32, rank: int = 6) -> MarkovCase:
    """Three requests (greedy, sampled, greedy) of 4 steps over 37 tokens; tied rows 2 and 30."""
    return MarkovCase(kind, 37, rank, 5, 4, [0.0, 0.8, 0.0], [1, 2, 3], [4, 5, 2**33], [0, 36, 7], data_seed,
                      zero_rows=(2, 30), tie_logit=TIE_LOGIT if data_seed % 2 else None, dtype=dtype)  # fmt: skip


def op_inputs(kind: str, data_seed: int, device, dtype=torch.float32, rank: int = 6) -> tuple:
    """The registered op's positional arguments."""
    args, kwargs = case_of(kind, data_seed, dtype, rank).op_args(device)
    return (*args, kind, kwargs.get("hidden_part"), kwargs.get("latent_weight"), kwargs["salt"])


def test_opcheck(device):
    """Each kind with fp32 weights of rank 6 and bf16 weights of rank 8 (a power of two:
    the kernels' unmasked, vectorised rows)."""
    for kind in KINDS:
        for dtype, rank in ((torch.float32, 6), (torch.bfloat16, 8)):
            torch.library.opcheck(torch.ops.specdraft.markov_block_sample, op_inputs(kind, 1, device, dtype, rank))


def three_heads(vanilla_args, gated_args, rnn_args):
    """Each kind's block: (tokens, corrected) of each."""
    out = []
    for kind, (args, kwargs) in zip(KINDS, (vanilla_args, gated_args, rnn_args), strict=True):
        out.extend(markov_block_sample(*args, kind=kind, **kwargs))
    return out


def head_inputs(data_seed: int, device):
    inputs = []
    for kind in KINDS:
        args, kwargs = case_of(kind, data_seed).op_args(device)
        kwargs.pop("kind")
        inputs.append((args, kwargs))
    return inputs


def test_fullgraph_equals_eager_without_graph_breaks(device):
    compiled = fresh_compile(three_heads, fullgraph=True)
    with CompileCounts.measure() as counts:
        for data_seed in (0, 1, 2):
            inputs = head_inputs(data_seed, device)
            eager, got = three_heads(*inputs), compiled(*inputs)
            for tokens_eager, tokens_got in zip(eager[::2], got[::2], strict=True):
                assert torch.equal(tokens_got, tokens_eager)
            for corrected_eager, corrected_got in zip(eager[1::2], got[1::2], strict=True):
                torch.testing.assert_close(corrected_got, corrected_eager, rtol=1e-5, atol=1e-5)
    assert counts.graph_breaks == 0
    assert counts.compiles == 1
