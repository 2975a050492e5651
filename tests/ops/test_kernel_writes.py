"""Inductor sees each kernel write only what the op writes: under torch.compile a
wrap_triton launch is analysed (its TTIR), and every argument the analysis says is
written is cloned and the tensor it came from rebuilt after the launch. An op input
judged written that way took training.draft_metrics' compiled CUDA graph down a path
whose results were wrong (torch 2.11, H200: accept sums off by 0.3-6 in one step;
eager and aot_eager right). The analysis runs on this CPU machine for the sm_90
target (fixtures/gpu_lowering.py), so this lane catches it: for every specdraft op
call of each ops test file's opcheck test and of the tree ops' launch tests, no
argument of its launches that shares storage with an op input the op's schema does
not mark mutable may be judged written."""

import importlib
import importlib.util

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fixtures.gpu_lowering import OPCHECK_TESTS, inductor_written_args, launch_values, ops_modules, recorded_launches
from fixtures.lanes import INTERPRETER

pytestmark = [
    pytest.mark.skipif(INTERPRETER, reason="the interpreter lane replaces @triton.jit kernels; this is the CPU lane's"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package"),
]


def read_only_storages(op, args, kwargs) -> set[int]:
    """Storage addresses of the op's tensor inputs that its schema does not mark as written."""
    schema = op._schema
    bound = dict(zip([a.name for a in schema.arguments], args, strict=False)) | kwargs
    storages = set()
    for argument in schema.arguments:
        written = argument.alias_info is not None and argument.alias_info.is_write
        values = bound.get(argument.name)
        for value in values if isinstance(values, list | tuple) else [values]:
            if isinstance(value, torch.Tensor) and not written and value.untyped_storage().nbytes():
                storages.add(value.untyped_storage().data_ptr())
    return storages


class OpCalls(TorchDispatchMode):
    """Records each specdraft op call: (op, its read-only input storages, the
    [start, end) of its launches in `launches`)."""

    def __init__(self, launches):
        super().__init__()
        self.launches, self.calls = launches, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace != "specdraft":
            return func(*args, **kwargs)
        start = len(self.launches)
        out = func(*args, **kwargs)
        self.calls.append((func, read_only_storages(func, args, kwargs), start, len(self.launches)))
        return out


def inputs_judged_written(calls, launches) -> list[str]:
    wrong, checked = [], set()
    for op, inputs, start, end in calls:
        for kernel, args, kwargs in launches[start:end]:
            tensors = {n: v for n, v in launch_values(kernel, args, kwargs).items() if isinstance(v, torch.Tensor)}
            on_inputs = {n for n, v in tensors.items() if v.untyped_storage().data_ptr() in inputs}
            key = (kernel.fn.__name__, tuple(sorted(on_inputs)))
            if key in checked:
                continue
            checked.add(key)
            names = sorted(on_inputs & inductor_written_args(kernel, args, kwargs))
            if names:
                wrong.append(f"{op}: Inductor judges {kernel.fn.__name__} to write its input(s) {names}")
    return wrong


@pytest.mark.parametrize(("module", "name", "extra"), OPCHECK_TESTS, ids=lambda v: v if isinstance(v, str) else "")
def test_no_op_input_is_judged_written(module, name, extra, monkeypatch):
    monkeypatch.setattr(torch.library, "opcheck", lambda op, args, kwargs=None, **_: op(*args, **(kwargs or {})))
    with recorded_launches(*ops_modules()) as launches, OpCalls(launches) as mode:
        getattr(importlib.import_module(module), name)(device="cpu", **extra)
    assert mode.calls and launches
    wrong = inputs_judged_written(mode.calls, launches)
    assert not wrong, "\n".join(wrong)


# The tree ops' launch tests (test_tree_kernels_compile_for_gpu.py), one variant each.
TREE_TESTS = [
    ("test_tree_expand", {"dtype": torch.float32}),
    ("test_tree_select", {"index": torch.int64}),
    ("test_tree_ancestors", {"index": torch.int64}),
    ("test_tree_positions", {"index": torch.int64, "rows": 3}),
    ("test_tree_commit_kv", {"dtype": torch.float32, "index": torch.int64, "layers": 3}),
    ("test_tree_verify", {"dtype": torch.float32}),
    ("test_top_logprobs", {"dtype": torch.float32, "vocab": 300, "k": 1}),
]


def test_no_tree_op_input_is_judged_written(monkeypatch):
    tree = importlib.import_module("ops.test_tree_kernels_compile_for_gpu")
    wrong, ops = [], set()

    def launches_of(call):
        with recorded_launches(*tree.MODULES) as launches, OpCalls(launches) as mode:
            call()
        assert mode.calls and launches
        ops.update(op for op, *_ in mode.calls)
        wrong.extend(inputs_judged_written(mode.calls, launches))
        return launches

    monkeypatch.setattr(tree, "launches_of", launches_of)
    monkeypatch.setattr(tree, "assert_compiles", lambda launches: None)
    for name, kwargs in TREE_TESTS:
        getattr(tree, name)(**kwargs)
    assert len(ops) >= len(TREE_TESTS)
    assert not wrong, "\n".join(wrong)
