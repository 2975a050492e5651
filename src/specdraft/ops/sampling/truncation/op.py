"""`truncation_cut`, the registered op, its public wrapper and checked mode's value
checker: CUDA tensors launch kernel.py's kernel, CPU tensors run reference.py's
torch."""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_tensor_arg
from specdraft.value_checks import first_bad

from ...backend import NAMESPACE, TRITON_INTERPRET, cdiv, power_of_two_tile, use_triton
from .kernel import truncation_cut_kernel
from .maxima import gather_kernel, level_kernel, maxima_kernel
from .reference import truncation_cut_reference
from .resolve import resolve_kernel
from .split import bracket_kernel, collect_kernel, count_kernel, window_kernel

# The low bits of an fp32 value that each logits dtype leaves zero (kernel.py's keys).
KEY_SHIFT = {torch.float32: 0, torch.float16: 13, torch.bfloat16: 16}

if TRITON_INTERPRET:
    # The interpreter emulates every lane in NumPy: small blocks keep it fast, make
    # small test rows span several blocks, and few pivots make the searches loop;
    # a small window and capacity send many rows to kernel.py's search, so both
    # paths run on the same examples.
    BLOCK, BINS, MASS_BLOCK, PIVOTS, NUM_WARPS = 16, 4, 16, 4, 4
    CHUNK, WINDOW_BINS, CAPACITY, RESOLVE_TILE, WINDOW_WARPS = 16, 8, 8, 4, 4
    MAXIMA_CHUNK, MAXIMA_GROUP, KEYS, KEYED_FROM, COLLECT_WARPS, COUNT_WARPS = 8, 2, 8, 4, 4, 4
    WINDOW_GROUP, COLLECT_GROUP, COUNT_GROUP, GATHER_PART, GATHER_WARPS = 2, 2, 2, 16, 4
else:
    CHUNK = 4096  # tokens a chunk of split.py's reads
    # Chunks a program of split.py's reads takes: a row off that path still launches
    # its programs, which only read the row's switches (B = 256, V = 152k, bf16, H200:
    # window 1 -> 8 took a top-k 50 cut 150 -> 144 us; the copy and count passes at 4
    # did top-k rows 8 us better but top-p rows 100 and 20 us worse, so they stay at 1).
    WINDOW_GROUP, COLLECT_GROUP, COUNT_GROUP = 8, 1, 1
    MAXIMA_CHUNK = 1024  # maxima.py's chunk: top-k up to V / 1,024 goes there
    MAXIMA_GROUP = 2  # chunks a program of maxima.py's max pass takes (1: 178, 2: 159, 8: 212 us a cut, top-k 50)
    GATHER_PART = 2048  # tokens a program of maxima.py's gather pass takes (4096: top-k 50 149 -> 185 us)
    GATHER_WARPS = 4  # (8: 153 us, 16: 175)
    WINDOW_BINS = 64  # split.py's bins below the max (63 counted, 1 for the rest)
    WINDOW_WARPS = 4  # its histogram pass: 93 us at 4 warps, 117 at 8 (B = 256, V = 152k, H200)
    CAPACITY = 4096  # values a row's range may copy out (more: kernel.py's search)
    KEYS = 64  # keys (- 1) a bf16 / fp16 row's range may count tokens of instead (<= CAPACITY)
    KEYED_FROM = 1024  # tokens in a row's range from which it counts per key, not copies
    COLLECT_WARPS = 16  # split.py's copy pass (top-p 0.9, T = 0.7, H200: 4 warps 503 us a cut, 8 389, 16 378)
    COUNT_WARPS = 4  # split.py's per-key count pass
    RESOLVE_TILE = 256  # copied values a tile of the resolve's passes
    BLOCK = 4096  # tokens per tile of the max, count and last passes (kernel.py: latency)
    BINS = 64  # buckets per search pass: the key interval shrinks 64x a pass (256: no faster on an H200)
    MASS_BLOCK = 1024  # tokens per tile of a top-p pass, a [MASS_BLOCK, PIVOTS] comparison
    PIVOTS = 16  # keys tried per top-p pass: the interval shrinks 17x a pass
    NUM_WARPS = 8


def _output(num_rows: int, device) -> torch.Tensor:
    return torch.empty((num_rows,), dtype=torch.float32, device=device)


def split_cut(logits, temperature, top_k, top_p, min_p) -> tuple[torch.Tensor, torch.Tensor]:
    """split.py's and maxima.py's kernels: (cut, done): done[row] = 1 where the cut is
    final, 0 where the row is left to kernel.py's search (its cut is then unset)."""
    num_rows, vocab = logits.shape
    device = logits.device
    num_chunks = cdiv(vocab, CHUNK)
    chunks = power_of_two_tile(num_chunks)
    maxima_chunks = cdiv(vocab, MAXIMA_CHUNK)
    cut = _output(num_rows, device)
    done = torch.empty((num_rows,), dtype=torch.int8, device=device)
    chunk_max = torch.empty((num_rows, num_chunks), dtype=torch.float32, device=device)
    # The window's counts; then, dead after bracket_kernel, the keyed collect's counts.
    hist = torch.empty((num_rows, num_chunks, max(WINDOW_BINS, KEYS)), dtype=torch.int32, device=device)
    # A row takes one path (split.py's or maxima.py's), so the two share these.
    bounds = torch.empty((num_rows, 3), dtype=torch.float32, device=device)
    span = torch.empty((num_rows, 3), dtype=torch.int32, device=device)
    count = torch.empty((num_rows,), dtype=torch.int32, device=device)
    values = torch.empty((num_rows, CAPACITY), dtype=torch.float32, device=device)
    rows = (bounds, span, count, values)
    sums = torch.empty((num_rows, num_chunks, 4), dtype=torch.float32, device=device)
    shift = KEY_SHIFT[logits.dtype]
    params = (temperature, top_k, top_p, min_p)
    wrap_triton(window_kernel)[(num_rows, cdiv(num_chunks, WINDOW_GROUP))](
        logits, *params, chunk_max, hist, vocab, logits.stride(0), num_chunks, maxima_chunks, hist.shape[2],
        CHUNK=CHUNK, GROUP=WINDOW_GROUP, NB=WINDOW_BINS, num_warps=WINDOW_WARPS,
    )  # fmt: skip
    wrap_triton(bracket_kernel)[(num_rows,)](
        *params, chunk_max, hist, hist.shape[2], bounds, span, count, cut, done, vocab, num_chunks, maxima_chunks,
        KEYED_FROM, NB=WINDOW_BINS, CHUNKS=chunks, CAPACITY=CAPACITY, SHIFT=shift, KEYS=KEYS, num_warps=4,
    )  # fmt: skip
    wrap_triton(collect_kernel)[(num_rows, cdiv(num_chunks, COLLECT_GROUP))](
        logits, temperature, top_p, bounds, span, count, values, sums, vocab, logits.stride(0), num_chunks,
        CHUNK=CHUNK, GROUP=COLLECT_GROUP, CAPACITY=CAPACITY, num_warps=COLLECT_WARPS,
    )  # fmt: skip
    if shift > 0:  # fp32 rows are never counted per key (bracket_kernel)
        wrap_triton(count_kernel)[(num_rows, cdiv(num_chunks, COUNT_GROUP))](
            logits, temperature, top_p, bounds, span, sums, hist, hist.shape[2], vocab, logits.stride(0), num_chunks,
            SHIFT=shift, CHUNK=CHUNK, GROUP=COUNT_GROUP, KEYS=KEYS, num_warps=COUNT_WARPS,
        )  # fmt: skip
    resolve = (CAPACITY, shift, RESOLVE_TILE, PIVOTS)
    resolve_rows(params, bounds, span, count, values, sums, (hist, hist.shape[2]), cut, done, vocab, num_chunks,
                 *resolve)  # fmt: skip
    maxima_rows(logits, params, rows, cut, done, maxima_chunks, *resolve)
    return cut, done


def resolve_rows(params, bounds, span, count, values, sums, keyed, cut, done, vocab, num_chunks,
                 capacity, shift, tile, pivots) -> None:  # fmt: skip
    """resolve.py's resolve_kernel over the rows whose span says go; keyed: (the keyed
    collect's counts, their stride a chunk)."""
    wrap_triton(resolve_kernel)[(cut.shape[0],)](
        *params, bounds, span, count, values, sums, *keyed, cut, done, vocab, num_chunks,
        CHUNKS=power_of_two_tile(num_chunks), CAPACITY=capacity, SHIFT=shift, TILE=tile, PIVOTS=pivots, KEYS=KEYS,
        num_warps=4,
    )  # fmt: skip


def maxima_rows(logits, params, rows, cut, done, num_chunks, capacity, shift, tile, pivots) -> None:
    """maxima.py's path for its rows (top-k on with k <= num_chunks, or min-p alone),
    after split.py's rows are resolved: its own maxima and sums, split_cut's row buffers (`rows`:
    bounds, span, count, values; level_kernel sets every row's go, so split.py's rows
    are not resolved twice), then resolve_kernel."""
    num_rows, vocab = logits.shape
    device = logits.device
    maxima = torch.empty((num_rows, num_chunks), dtype=torch.float32, device=device)
    num_parts = cdiv(vocab, GATHER_PART)
    sums = torch.empty((num_rows, num_parts, 4), dtype=torch.float32, device=device)
    bounds, span, count, values = rows
    wrap_triton(maxima_kernel)[(num_rows, cdiv(num_chunks, MAXIMA_GROUP))](
        logits, *params, maxima, vocab, logits.stride(0), num_chunks, CHUNK=MAXIMA_CHUNK, GROUP=MAXIMA_GROUP,
        num_warps=4,
    )  # fmt: skip
    wrap_triton(level_kernel)[(num_rows,)](
        *params, maxima, bounds, span, count, cut, done, vocab, num_chunks, CHUNKS=power_of_two_tile(num_chunks),
        num_warps=4,
    )  # fmt: skip
    wrap_triton(gather_kernel)[(num_rows, num_parts)](
        logits, *params, bounds, span, count, values, sums, vocab, logits.stride(0), num_parts, num_chunks,
        PART=GATHER_PART, CAPACITY=capacity, num_warps=GATHER_WARPS,
    )  # fmt: skip
    no_keyed = (torch.empty((0,), dtype=torch.int32, device=device), 0)  # go is never 2 here
    resolve_rows(params, bounds, span, count, values, sums, no_keyed, cut, done, vocab, num_parts, capacity, shift,
                 tile, pivots)  # fmt: skip


def _launch(logits, temperature, top_k, top_p, min_p) -> torch.Tensor:
    num_rows, vocab = logits.shape
    if num_rows == 0:
        return _output(num_rows, logits.device)
    cut, done = split_cut(logits, temperature, top_k, top_p, min_p)
    wrap_triton(truncation_cut_kernel)[(num_rows,)](
        logits, temperature, top_k, top_p, min_p, cut, done, vocab, logits.stride(0),
        SHIFT=KEY_SHIFT[logits.dtype], BLOCK=BLOCK, BINS=BINS, MASS_BLOCK=MASS_BLOCK, PIVOTS=PIVOTS,
        num_warps=NUM_WARPS,
    )  # fmt: skip
    return cut


@triton_op(f"{NAMESPACE}::truncation_cut", mutates_args=())
def _truncation_cut_op(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    if not use_triton(logits):
        return truncation_cut_reference(logits, temperature, top_k, top_p, min_p)
    return _launch(logits, temperature, top_k, top_p, min_p)


@_truncation_cut_op.register_fake
def _truncation_cut_fake(logits, temperature, top_k, top_p, min_p):
    return _output(logits.shape[0], logits.device)


# ------------------------------------------------------------------ public wrapper


def truncation_cut(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Each row's logit cut for its request's top-k, top-p and min-p (the package
    docstring gives the rule): the row's distribution is softmax(logits / T) over
    {i : logits[i] >= cut}, renormalised. The cut is a value of the row, or -inf
    (keep every token: greedy rows, rows with every parameter off, rows with no
    logit above -inf).

    No host sync. On CUDA split.py's and maxima.py's kernels (two reads of the
    logits each, over the whole GPU, for the rows each takes), then kernel.py's
    per-row search for the rows they leave undone and the min-p rows maxima.py
    does not take (top-p beside it, top-k off); no sort (the package docstring
    names the files).

    Args:
        logits: [R, V] fp32 / bf16 / fp16; rows contiguous, any row stride.
        temperature: [R] fp32, contiguous; a row with T <= 0 (greedy) is not truncated.
        top_k: [R] int32 / int64, contiguous; <= 0 or >= V: off.
        top_p: [R] fp32, contiguous; >= 1: off. In (0, 1]: checked mode refuses the
            rest (the op keeps the max's tie group at top_p <= 0, treats NaN as off).
        min_p: [R] fp32, contiguous; <= 0: off. In [0, 1]: checked mode refuses the
            rest (the op treats min_p > 1 as 1, NaN as off).

    Returns:
        cut: [R] fp32.
    """
    check_tensor_arg("logits", logits, FLOAT_DTYPES, shape=(None, at_least(1, "V")), contiguous="rows")
    num_rows = logits.shape[0]
    row = {"shape": (num_rows,), "contiguous": True, "device_of": logits}
    check_tensor_arg("temperature", temperature, torch.float32, **row)
    check_tensor_arg("top_k", top_k, INDEX_DTYPES, **row)
    check_tensor_arg("top_p", top_p, torch.float32, **row)
    check_tensor_arg("min_p", min_p, torch.float32, **row)
    if is_checked():
        check_truncation_cut_values(temperature, top_p, min_p)
    return _truncation_cut_op(logits, temperature, top_k, top_p, min_p)


# --------------------------------------------- checked mode's value checks (syncs)


def check_truncation_cut_values(temperature: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> None:
    """truncation_cut: temperature finite and >= 0; top_p in (0, 1]; min_p in [0, 1].
    Every top_k is valid (<= 0 or >= V: off)."""
    first_bad("temperature", ~(torch.isfinite(temperature) & (temperature >= 0)), temperature,
              "must be finite and >= 0 (0 = greedy)")  # fmt: skip
    first_bad("top_p", ~((top_p > 0) & (top_p <= 1)), top_p, "is outside (0, 1] (1 = off)")
    first_bad("min_p", ~((min_p >= 0) & (min_p <= 1)), min_p, "is outside [0, 1] (0 = off)")
