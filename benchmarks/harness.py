"""Shared GPU benchmark helpers: timing, yardsticks, markdown tables.

All times are GPU times from CUDA-graph replays (triton.testing.do_bench_cudagraph),
so Python launch overhead, which a serving engine removes with CUDA graphs too,
does not hide the kernels' own cost. Medians, in microseconds.
"""

import os
import sys
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from tables import markdown_table
from triton.testing import do_bench, do_bench_cudagraph


def time_us(fn: Callable[[], object], rep: int = 50) -> float:
    fn()  # compile / autotune outside the captured graph
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3


@triton.jit
def _empty_kernel(x_ptr):
    pass


def empty_kernel_us() -> float:
    """The floor: one empty Triton kernel launch, timed the same way."""
    x = torch.empty(1, device="cuda")
    return time_us(lambda: _empty_kernel[(1,)](x))


@triton.jit
def _load_store_kernel(src_ptr, dst_ptr):
    tl.store(dst_ptr, tl.load(src_ptr) + 1)


def load_store_kernel_us() -> float:
    """The floor of any op that reads its input: one program that loads one int32
    and stores one, timed the same way (the load's round trip is what it adds to
    an empty launch)."""
    src = torch.zeros(1, dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    return time_us(lambda: _load_store_kernel[(1,)](src, dst))


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """The yardstick: a plain device-to-device copy, bytes read + written per second.

    Timed with events, not a CUDA graph: captured, `copy_` becomes a memcpy node on
    the copy engines, which is slower than the copy kernel an eager call runs.
    Large enough that launch overhead does not count."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), rep=200, return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9


def gbs(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9


def compiled(fn: Callable) -> Callable:
    return torch.compile(fn, fullgraph=True, dynamic=False)


def emit(name: str, text: str) -> None:
    """Print, and save under $OUT (the device tool's output folder) when set."""
    print(text)
    sys.stdout.flush()
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"{name}.md"), "w") as f:
            f.write(text + "\n")


def device_name() -> str:
    return f"{torch.cuda.get_device_name()} (torch {torch.__version__}, triton {triton.__version__})"


__all__ = [
    "tl",
    "time_us",
    "empty_kernel_us",
    "load_store_kernel_us",
    "copy_bandwidth_gbs",
    "gbs",
    "compiled",
    "markdown_table",
    "emit",
]
