"""opcheck for markov_block_sample (each kind, fp32 and bf16 weights); a block's
three Markov heads compiled as one fullgraph=True function equal eager, with no
graph break and one compile serving several blocks; the kernels compile for sm_90 as
the served shapes launch them."""

import importlib.util

import pytest
import torch

from specdraft.ops import markov_block_sample
from specdraft.testing import CompileCounts, fresh_compile

from fixtures.gpu_lowering import compile_for_gpu, recorded_launches, signature_of
from fixtures.lanes import INTERPRETER
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


@pytest.mark.skipif(INTERPRETER, reason="the interpreter lane replaces @triton.jit kernels; this is the CPU lane's")
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package")
@pytest.mark.parametrize(
    ("kind", "num_reqs", "rank"),
    [("vanilla", 1, 256), ("gated", 8, 256), ("rnn", 5, 512)],
    ids=["vanilla-B1", "gated-B8", "rnn-B5-r512"],
)
def test_kernels_compile_for_sm90_as_served(kind, num_reqs, rank):
    """bf16 weights at the benchmark's rank (tests/ops/test_kernels_compile_for_gpu.py
    compiles opcheck's small ones): a one-request program (the product's N padded), a
    group of 8 (warpgroup MMA), a group part empty with the rank in two blocks of K;
    each kernel compiled with its launch's warps, stages and the JIT's alignment."""
    import specdraft.ops.markov_block.op as markov_op

    case = MarkovCase(kind, 1000, rank, 16, 2, [0.0, 0.7] * 4, list(range(8)), [3] * 8, [1] * 8, 0,
                      dtype=torch.bfloat16)  # fmt: skip
    args, kwargs = case.op_args("cpu")
    args = [a[:num_reqs] if i in (0, 1, 4, 5, 6) else a for i, a in enumerate(args)]
    if kind != "vanilla":
        kwargs["hidden_part"] = kwargs["hidden_part"][:num_reqs]
    with recorded_launches(markov_op) as launches:
        markov_block_sample(*args, **kwargs)
    seen = set()
    for kernel, launch_args, launch_kwargs in launches:
        signature, constexprs = signature_of(kernel, launch_args, launch_kwargs)
        key = (kernel.fn.__name__, tuple(signature.items()), tuple(sorted(constexprs.items(), key=str)))
        if key not in seen:
            seen.add(key)
            assert compile_for_gpu(kernel, launch_args, launch_kwargs, as_launched=True).asm["cubin"]
    assert {name for name, _, _ in seen} >= {"markov_bias_kernel", "markov_last_token_kernel"}
