"""Shift-and-cache on the GPU: the Triton ops vs the eager reference vs
torch.compile(reference), with a device-to-device copy as the bandwidth yardstick.

    python benchmarks/bench_shift_and_cache.py            # the table in benchmarks/README.md
    python benchmarks/bench_shift_and_cache.py --tiles    # also try hidden tile shapes
"""

import argparse

import torch
from harness import copy_bandwidth_gbs, device_name, emit, gbs, markdown_table, time_us
from record import append_table

import specdraft.ops.shift_and_cache as sc

MAX_SHIFT = 4


def make_batch(batch: int, window: int, hidden: int | None, dtype):
    tokens = batch * window
    qsl = torch.arange(0, tokens + 1, window, dtype=torch.int32, device="cuda")
    # Every request shifts by 2 from a full cache: both the prefix and body paths run.
    meta = {
        "query_start_loc": qsl,
        "token_indices_to_sample": qsl[1:] - 1,
        "shift": torch.full((batch,), min(2, window), dtype=torch.int32, device="cuda"),
        "cached_lens": torch.full((batch,), MAX_SHIFT, dtype=torch.int32, device="cuda"),
    }
    if hidden is None:
        src = torch.randint(0, 1 << 30, (tokens,), dtype=torch.int32, device="cuda")
        cache = torch.randint(0, 1 << 30, (batch, MAX_SHIFT), dtype=torch.int32, device="cuda")
    else:
        src = torch.randn(tokens, hidden, dtype=dtype, device="cuda")
        cache = torch.randn(batch, MAX_SHIFT, hidden, dtype=dtype, device="cuda")
    return src, torch.empty_like(src), cache, meta


def runners(src, dst, cache, meta, window, hidden):
    args = (meta["query_start_loc"], meta["token_indices_to_sample"], meta["shift"], meta["cached_lens"])
    if hidden is None:
        op, ref = sc.shift_and_cache_1d, sc.shift_and_cache_1d_reference
    else:
        op, ref = sc.shift_and_cache_hidden, sc.shift_and_cache_hidden_reference
    compiled_dynamic = torch.compile(ref, fullgraph=True, dynamic=True)
    return {
        "triton op": lambda: op(src, dst, cache, *args, max_query_len=window),
        "eager reference": lambda: ref(src, dst, cache, *args),
        "compile(ref, dynamic)": lambda: compiled_dynamic(src, dst, cache, *args),
    }


def check_exact(src, dst, cache, meta, window, hidden):
    args = (meta["query_start_loc"], meta["token_indices_to_sample"], meta["shift"], meta["cached_lens"])
    d1, c1, d2, c2 = dst.clone(), cache.clone(), dst.clone(), cache.clone()
    if hidden is None:
        sc.shift_and_cache_1d(src, d1, c1, *args, max_query_len=window)
        sc.shift_and_cache_1d_reference(src, d2, c2, *args)
    else:
        sc.shift_and_cache_hidden(src, d1, c1, *args, max_query_len=window)
        sc.shift_and_cache_hidden_reference(src, d2, c2, *args)
    assert torch.equal(d1, d2) and torch.equal(c1, c2), "Triton and reference differ"


def bench_row(batch, window, hidden, dtype, copy_gbs):
    src, dst, cache, meta = make_batch(batch, window, hidden, dtype)
    check_exact(src, dst.fill_(0), cache.clone(), meta, window, hidden)
    moved = 2 * src.numel() * src.element_size()  # read the window, write it shifted
    cells = {}
    for name, fn in runners(src, dst, cache, meta, window, hidden).items():
        try:
            cells[name] = time_us(fn)
        except torch.OutOfMemoryError:
            cells[name] = float("nan")
        torch.cuda.empty_cache()
    op_us = cells["triton op"]
    best_other = min(v for k, v in cells.items() if k != "triton op")
    row = [batch, window, hidden or "1-D int32", *cells.values()]
    row += [gbs(moved, op_us), 100 * gbs(moved, op_us) / copy_gbs, best_other / op_us]
    del src, dst, cache
    torch.cuda.empty_cache()
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiles", action="store_true", help="try hidden tile shapes at the largest size")
    opts = parser.parse_args()
    torch._dynamo.config.cache_size_limit = 64
    copy_gbs = copy_bandwidth_gbs()
    headers = ["B", "window", "hidden", "triton op µs", "eager ref µs", "compile(ref) µs", "op GB/s",
               "% of copy", "speedup vs best other"]  # fmt: skip
    rows = []
    for hidden in (None, 4096, 7168):
        for window in (4, 1024):
            for batch in (1, 8, 64, 512):
                rows.append(bench_row(batch, window, hidden, torch.bfloat16, copy_gbs))
                print(rows[-1], flush=True)
    text = (
        f"Device: {device_name()}; device-to-device copy: {copy_gbs:.0f} GB/s (read + write).\n"
        f"MAX_SHIFT={MAX_SHIFT}, shift 2, hidden states bf16; times are CUDA-graph replays (median).\n\n"
        + markdown_table(headers, rows)
    )
    emit("shift_and_cache", text)
    append_table("shift_and_cache", headers, rows, config_columns=3)

    if opts.tiles:
        tile_rows = []
        for bt, bh, warps in ((32, 256, 4), (16, 512, 4), (32, 512, 8), (64, 256, 8), (8, 1024, 4)):
            sc.hidden.BLOCK_TOKENS_HIDDEN, sc.hidden.BLOCK_HIDDEN, sc.hidden.NUM_WARPS_HIDDEN = bt, bh, warps
            src, dst, cache, meta = make_batch(512, 1024, 7168, torch.bfloat16)
            fn = runners(src, dst, cache, meta, 1024, 7168)["triton op"]
            us = time_us(fn)
            tile_rows.append([bt, bh, warps, us, gbs(2 * src.numel() * 2, us)])
            del src, dst, cache
            torch.cuda.empty_cache()
        tile_headers = ["BLOCK_TOKENS", "BLOCK_HIDDEN", "num_warps", "µs", "GB/s"]
        emit("shift_tiles", markdown_table(tile_headers, tile_rows))
        append_table("shift_and_cache_tiles", tile_headers, tile_rows, config_columns=3,
                     config={"B": 512, "window": 1024, "hidden": 7168})  # fmt: skip


if __name__ == "__main__":
    main()
