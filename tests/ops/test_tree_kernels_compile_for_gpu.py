"""Every Triton kernel of the draft-tree ops compiles for an sm_90 GPU, from the
launches each op's own code makes (fixtures/gpu_lowering.py), on this CPU machine:
int32 and int64 index tensors, fp32 and bf16 scores, logits and caches, 1-D and
M-RoPE positions. A kernel that only the interpreter accepts (it checks no types)
fails here as it would on the first CUDA launch: tree_ancestors' walk once carried
an int32 node index that its loop reassigned as int64, which no CPU lane saw and
which stopped every tree on the H200."""

import importlib
import importlib.util

import pytest
import torch

from specdraft.ops import (
    top_logprobs,
    tree_ancestors,
    tree_commit_kv,
    tree_expand,
    tree_positions,
    tree_select,
    tree_verify,
)

from fixtures.gpu_lowering import compile_for_gpu, recorded_launches
from fixtures.lanes import INTERPRETER

pytestmark = [
    pytest.mark.skipif(INTERPRETER, reason="the interpreter lane replaces @triton.jit kernels; this is the CPU lane's"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package"),
]

INDEX = [torch.int32, torch.int64]
# The modules themselves (the package exports functions of the same names).
MODULES = [
    importlib.import_module(f"specdraft.ops.{name}")
    for name in (
        "tree_structure.expand",
        "tree_structure.select",
        "tree_structure.ancestors",
        "tree_structure.positions",
        "tree_commit_kv",
        "sampling.tree_verify",
        "top_logprobs",
    )
]


def launches_of(call) -> list:
    with recorded_launches(*MODULES) as launches:
        call()
    assert launches, "the op launched no kernel"
    return launches


def assert_compiles(launches) -> None:
    for kernel, args, kwargs in launches:
        compiled = compile_for_gpu(kernel, args, kwargs)
        assert compiled.asm["cubin"], kernel.fn.__name__


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_expand(dtype):
    assert_compiles(
        launches_of(lambda: tree_expand(torch.zeros(2, 4, dtype=dtype), torch.zeros(2, 4, 4, dtype=dtype), 4))
    )


@pytest.mark.parametrize("index", INDEX)
def test_tree_select(index):
    pool = torch.zeros(2, 68, dtype=index)
    assert_compiles(
        launches_of(lambda: tree_select(pool, torch.zeros(2, 68), pool, pool + 1, torch.zeros(2, dtype=index), 16))
    )


@pytest.mark.parametrize("index", INDEX)
def test_tree_ancestors(index):
    assert_compiles(launches_of(lambda: tree_ancestors(torch.full((2, 16), -1, dtype=index))))


@pytest.mark.parametrize("rows", [1, 3], ids=["1d", "mrope"])
@pytest.mark.parametrize("index", INDEX)
def test_tree_positions(index, rows):
    roots = torch.zeros((2,) if rows == 1 else (3, 2), dtype=index)
    assert_compiles(launches_of(lambda: tree_positions(roots, torch.zeros(2, 16, dtype=index), 64)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index", INDEX)
@pytest.mark.parametrize("layers", [1, 3, 9])
def test_tree_commit_kv(dtype, index, layers):
    caches = [torch.zeros(2, 4, 16, 2, 64, dtype=dtype) for _ in range(layers)]
    slots = torch.zeros(2, 5, dtype=index)
    launches = launches_of(lambda: tree_commit_kv(caches, slots, slots))
    assert len(launches) == (layers + 7) // 8  # 8 caches a launch
    assert_compiles(launches)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_verify(dtype):
    tokens = torch.zeros(2, 16, dtype=torch.int64)
    parents = torch.arange(-1, 15).expand(2, 16).contiguous()
    logits = torch.zeros(2, 16, 300, dtype=dtype)
    call = lambda: tree_verify(tokens, parents, logits, torch.ones(2), torch.zeros(2, dtype=torch.int64),  # noqa: E731
                               torch.zeros(2, dtype=torch.int64), max_depth=5)  # fmt: skip
    launches = launches_of(call)
    assert len({kernel.fn.__name__ for kernel, _, _ in launches}) == 3  # stats, walk, finish
    assert_compiles(launches)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("vocab", "k"), [(32000, 4), (128256, 8), (300, 1)])
def test_top_logprobs(dtype, vocab, k):
    assert_compiles(launches_of(lambda: top_logprobs(torch.zeros(4, vocab, dtype=dtype), k)))
