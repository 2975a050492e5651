"""Inductor sees each kernel write only what the op writes: under torch.compile a
wrap_triton launch is analysed (its TTIR), and every argument the analysis says is
written is cloned and the tensor it came from rebuilt after the launch. An op input
judged written that way took training.draft_metrics' compiled CUDA graph down a path
whose results were wrong (torch 2.11, H200: accept sums off by 0.3-6 in one step;
eager and aot_eager right). The analysis runs on this CPU machine for the sm_90
target (fixtures/gpu_lowering.py), so this lane catches it: for each op of each ops
test file, no argument of its launches that shares storage with an op input the
op's schema does not mark mutable may be judged written."""

import importlib
import importlib.util

import pytest
import torch

from fixtures.gpu_lowering import OPCHECK_TESTS, inductor_written_args, ops_modules, recorded_launches
from fixtures.lanes import INTERPRETER

pytestmark = [
    pytest.mark.skipif(INTERPRETER, reason="the interpreter lane replaces @triton.jit kernels; this is the CPU lane's"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package"),
]


def read_only_storages(op, args, kwargs) -> set[int]:
    """Storage addresses of the op's tensor inputs that its schema does not mark as written."""
    schema = (op if hasattr(op, "_schema") else op.default)._schema
    bound = dict(zip([a.name for a in schema.arguments], args, strict=False)) | kwargs
    storages = set()
    for argument in schema.arguments:
        written = argument.alias_info is not None and argument.alias_info.is_write
        values = bound.get(argument.name)
        for value in values if isinstance(values, list | tuple) else [values]:
            if isinstance(value, torch.Tensor) and not written and value.untyped_storage().nbytes():
                storages.add(value.untyped_storage().data_ptr())
    return storages


@pytest.mark.parametrize(("module", "name", "extra"), OPCHECK_TESTS, ids=lambda v: v if isinstance(v, str) else "")
def test_no_op_input_is_judged_written(module, name, extra, monkeypatch):
    calls = []  # (op, read-only input storages, its launches' [start, end) in the record)

    def call_once(op, args, kwargs=None, **_):
        kwargs = kwargs or {}
        start = len(launches)
        op(*args, **kwargs)
        calls.append((op, read_only_storages(op, args, kwargs), start, len(launches)))

    monkeypatch.setattr(torch.library, "opcheck", call_once)
    with recorded_launches(*ops_modules()) as launches:
        getattr(importlib.import_module(module), name)(device="cpu", **extra)
    assert calls and launches
    checked, wrong = set(), []
    for op, inputs, start, end in calls:
        for kernel, args, kwargs in launches[start:end]:
            values = dict(zip(kernel.arg_names, args, strict=False)) | kwargs
            tensors = {n: v for n, v in values.items() if isinstance(v, torch.Tensor)}
            key = (
                kernel.fn.__name__,
                tuple(sorted(n for n, v in tensors.items() if v.untyped_storage().data_ptr() in inputs)),
            )
            if key in checked:
                continue
            checked.add(key)
            written = inductor_written_args(kernel, args, kwargs)
            names = sorted(n for n in written if n in tensors and tensors[n].untyped_storage().data_ptr() in inputs)
            if names:
                wrong.append(f"{op}: Inductor judges {kernel.fn.__name__} to write its input(s) {names}")
    assert not wrong, "\n".join(wrong)
