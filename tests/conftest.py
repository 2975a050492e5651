"""Shared test setup: Hypothesis profiles, the lanes (which tests run where), the
device every suite runs on, each pytest-xdist worker's share of the CPU threads,
and NaN-poisoned torch.empty so no op can pass by reading memory it never wrote.

Lanes, chosen by marker alone:
- `interpreter`: Triton kernels on CPU tensors; skipped unless TRITON_INTERPRET=1
  (without it the op bodies take the reference, and such a test would compare the
  reference with itself);
- `cuda`: needs a CUDA device; skipped without one;
- `kernel`: compares an op with an oracle; runs in every lane;
- everything else: the CPU (or SPECDRAFT_DEVICE=cuda) lane.
"""

import json
import os
from pathlib import Path

# Before torch starts CUDA: with SPECDRAFT_GPUS=N on a machine of N GPUs, xdist worker
# gwK sees GPU K % N alone, so "cuda" in every test means that worker's GPU and the
# suite spreads over the machine.
if int(os.environ.get("SPECDRAFT_GPUS", "1")) > 1 and os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    worker = int(os.environ["PYTEST_XDIST_WORKER"][2:])
    os.environ["CUDA_VISIBLE_DEVICES"] = str(worker % int(os.environ["SPECDRAFT_GPUS"]))

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from fixtures import compile_profile, interpreter_calls  # noqa: E402
from fixtures.lanes import DEVICE, INTERPRETER  # noqa: E402
from fixtures.matrix import FULL_MATRIX  # noqa: E402

# ci: fixed seed, no deadline (compiles and the interpreter are slow), few examples.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "nightly",
    deadline=None,
    max_examples=1000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

if DEVICE == "cuda" and not torch.cuda.is_available():
    raise pytest.UsageError("SPECDRAFT_DEVICE=cuda but torch sees no CUDA device")


def share_cores_between_workers() -> None:
    """Each pytest-xdist worker takes its share of torch's intra-op threads (at least
    one) unless OMP_NUM_THREADS says otherwise. Left at the default, each of 2 workers
    on 2 cores ran 2 OpenMP threads that spin while they wait: the far-tail sampling
    tests took 101 s instead of 45 on 2 workers, and Inductor compiled every C++
    kernel for threads the worker never gets."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


def pytest_configure(config):
    share_cores_between_workers()
    if INTERPRETER:
        interpreter_calls.install()  # nested @triton.jit calls without a redundant patch scan
    compile_profile.register(config)  # SPECDRAFT_TEST_PROFILE=DIR only


# Seconds per test file and lane, from a profile of the suite (scripts/test_profile.py
# --write-durations): the heaviest files are handed out first (pytest-xdist's
# loadfile), so no worker idles at the end behind one long file. A file not listed
# yet counts as the heaviest.
FILE_SECONDS = json.loads((Path(__file__).parent / "file_durations.json").read_text())


def heaviest_files_first(items) -> None:
    seconds = FILE_SECONDS.get("interpreter" if INTERPRETER else "cpu", {})
    # A stable sort on the file alone: each file's tests stay together, in their order.
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], float("inf")))


def pytest_collection_modifyitems(config, items):
    heaviest_files_first(items)
    no_interpreter = pytest.mark.skip(reason="interpreter lane only: needs TRITON_INTERPRET=1 before triton loads")
    no_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "interpreter" in item.keywords and not INTERPRETER:
            item.add_marker(no_interpreter)
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)


@pytest.fixture(scope="session")
def device() -> str:
    return DEVICE


_real_empty, _real_empty_like = torch.empty, torch.empty_like


QUANTIZED = {torch.quint8, torch.qint8, torch.qint32, torch.quint4x2, torch.quint2x4}


def poison_value(dtype: torch.dtype):
    """What a fresh torch.empty of `dtype` is filled with, or None for a dtype that
    fill_ does not take (quantized, bit and sub-byte types): NaN for floating and
    complex, True for bool, and for integers a 0x5A / 0xA5 byte pattern that fits
    the dtype's width. Fitting matters: torch's own callers (Inductor asks for
    torch.empty((), dtype=torch.int16) while scheduling) must never see the fill
    overflow."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    if dtype in QUANTIZED:
        return None
    try:
        info = torch.iinfo(dtype)
    except TypeError:  # bit types
        return None
    if info.bits < 8:
        return None
    if dtype.is_signed:
        return -int("5A" * (info.bits // 8), 16)
    return int("A5" * (info.bits // 8), 16)


@torch.no_grad()  # torch's own callers may ask for requires_grad=True leaves
def _poison(t: torch.Tensor) -> torch.Tensor:
    # Real eager tensors only. While torch.compile traces (Dynamo, or AOT decomposing
    # a triton_op body, where is_compiling() is already False) tensors are fake or
    # functional subclasses: a fill there would be a traced mutation of an
    # intermediate, which AOT rejects; Inductor allocates its own buffers anyway.
    if type(t) is not torch.Tensor or torch.compiler.is_compiling():
        return t
    value = poison_value(t.dtype)
    if value is None:
        return t
    try:
        return t.fill_(value)
    except (RuntimeError, NotImplementedError):  # a dtype with no fill kernel on this device
        return t


@pytest.fixture(autouse=True)
def poisoned_empty(monkeypatch):
    monkeypatch.setattr(torch, "empty", lambda *a, **k: _poison(_real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: _poison(_real_empty_like(*a, **k)))


@pytest.fixture(autouse=True)
def scalar_cpu_codegen(request):
    """Inductor's CPU compiles in this lane emit C++ without SIMD code (cpp.simdlen=0,
    what `specdraft demo` compiles with on CPU) unless the test is marked
    `vectorised`: generating the vector code is most of a CPU compile's time (a
    multi-layer propose 66 s with it, 41 s without, on the 2-core machine), and the
    compile tests check this package's graphs (fullgraph, breaks, recompiles, results),
    which the vector code does not change. The `vectorised` tests keep Inductor's
    default: flex attention (whose CPU template needs the vector ISA), the README's
    blocks as a user runs them, and the statistics whose compiled reference runs 1e9
    noise draws; the nightly profile (or SPECDRAFT_FULL_MATRIX=1) compiles every test
    vectorised. A per-compile patch: the process's ISA probe is unaffected
    (tests/test_demo.py::test_demo_options_leave_later_compiles_vectorised)."""
    if DEVICE != "cpu" or FULL_MATRIX or request.node.get_closest_marker("vectorised"):
        yield
        return
    import torch._inductor.config as inductor_config

    from specdraft.demo import compile_options

    with inductor_config.patch(compile_options("cpu", True)["options"]):
        yield


@pytest.fixture(autouse=True)
def keep_cpu_threads():
    """The command-line tests run `specdraft demo | capture | eval` in-process, and each
    sets torch's CPU threads (--threads, default 1): the next test gets the count
    share_cores_between_workers chose back."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
