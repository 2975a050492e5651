"""Every op's Triton kernels compile for an sm_90 GPU on this CPU machine: each ops
test file's opcheck test runs with opcheck replaced by one call of the op and every
kernel launch recorded instead of made (fixtures/gpu_lowering.py); then each
recorded (kernel, argument types, constexprs) is compiled down to the cubin. What
only Triton's compiler checks (types of loop-carried values, constexpr misuse) fails
here, not at the first CUDA launch. The tree ops' own variants (int32 / int64
indices, bf16): test_tree_kernels_compile_for_gpu.py."""

import importlib
import importlib.util

import pytest
import torch

from specdraft.ops import draft_sample, rejection_sample

from fixtures.gpu_lowering import OPCHECK_TESTS, compile_for_gpu, ops_modules, recorded_launches, signature_of
from fixtures.lanes import INTERPRETER

pytestmark = [
    pytest.mark.skipif(INTERPRETER, reason="the interpreter lane replaces @triton.jit kernels; this is the CPU lane's"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package"),
]


@pytest.mark.parametrize(("module", "name", "extra"), OPCHECK_TESTS, ids=lambda v: v if isinstance(v, str) else "")
def test_every_launched_kernel_compiles(module, name, extra, monkeypatch):
    def call_once(op, args, kwargs=None, **_):
        op(*args, **(kwargs or {}))

    monkeypatch.setattr(torch.library, "opcheck", call_once)
    with recorded_launches(*ops_modules()) as launches:
        getattr(importlib.import_module(module), name)(device="cpu", **extra)
    assert_every_kernel_compiles(launches)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sampling_kernels_compile_for_half_precision_logits(dtype):
    """The opcheck tests feed fp32 logits; serving feeds bf16 / fp16 ones."""
    sampling = importlib.import_module("ops.sampling.test_sampling_compile")
    t, steps, probs = sampling.inputs(sampling.batch_of(6), "cpu")
    logits, target = t["logits"].to(dtype), t["target_logits"].to(dtype)
    req = (t["temperature"], t["seeds"], t["positions"])
    with recorded_launches(*ops_modules()) as launches:
        draft_sample(logits, *req)
        draft_sample(logits, *req, probs_out=probs, step=steps[1])
        for draft_probs in (t["draft_probs"], None):
            rejection_sample(t["draft_tokens"], t["num_draft_tokens"], draft_probs, target, *req)
    assert_every_kernel_compiles(launches)


def assert_every_kernel_compiles(launches) -> None:
    """Each distinct recorded (kernel, argument types, constexprs) compiles for sm_90."""
    assert launches, "no kernel launched"
    seen = set()
    for kernel, args, kwargs in launches:
        signature, constexprs = signature_of(kernel, args, kwargs)
        key = (kernel.fn.__name__, tuple(signature.items()), tuple(sorted(constexprs.items(), key=str)))
        if key in seen:
            continue
        seen.add(key)
        assert compile_for_gpu(kernel, args, kwargs).asm["cubin"], kernel.fn.__name__
