"""ops.vocab_metrics (one fused pass over the vocabulary: both argmaxes, both
logsumexps, sum min(p, q)) against the plain torch computation SpecForge runs
(softmax of both rows, minimum, sum; argmax; logsumexp), T = 8192 rows of bf16
logits, V = 32k and 128k, and 128k with a 32k draft vocabulary through d2t
(Llama-3-sized EAGLE-3).

Columns: median time (triton.testing.do_bench, CUDA events; one call reads 1-4 GB,
so launch overhead does not matter); peak extra memory (max_memory_allocated during
the call minus what was allocated before it); GB/s counting each logit read once
(draft [T, Vd] + target [T, V]); % of copy: that rate over the rate of a
device-to-device copy of the same number of bytes (read + written, as
harness.copy_bandwidth_gbs counts). Target: >= 70 % of copy bandwidth.

    python benchmarks/bench_vocab_metrics.py                # about two minutes
    python benchmarks/bench_vocab_metrics.py --tiles        # also the kernel's tile sweep
    python benchmarks/bench_vocab_metrics.py --smoke        # CPU, tiny sizes: a check of the script
"""

import argparse
import importlib

import torch
from record import append_rows, append_table, table_pairs
from tables import markdown_table, wall_median_us

from specdraft.ops import vocab_metrics

TILES = [(2048, 8), (1024, 4), (1024, 8), (4096, 16)]  # (BLOCK_V, num_warps); first: the module default


def plain_metrics(draft, target, draft_ids):
    """What a trainer computes without the op (SpecForge's acceptance rate): both
    softmaxes materialised in fp32, the target's on the draft ids, minimum, sum."""
    q = torch.softmax(draft.float(), -1)
    p = torch.softmax(target.float(), -1)
    if draft_ids is not None:
        p = p[:, draft_ids]
    accept = torch.minimum(p, q).sum(-1)
    return (
        draft.argmax(-1),
        target.argmax(-1),
        torch.logsumexp(draft.float(), -1),
        torch.logsumexp(target.float(), -1),
        accept,
    )


def make_inputs(rows: int, vocab: int, draft_vocab: int, device: str):
    g = torch.Generator(device=device).manual_seed(0)
    target = torch.randn(rows, vocab, device=device, generator=g).mul_(3).to(torch.bfloat16)
    draft = torch.randn(rows, draft_vocab, device=device, generator=g).mul_(3).to(torch.bfloat16)
    d2t = draft_ids = None
    if draft_vocab != vocab:
        draft_ids = torch.randperm(vocab, device=device, generator=g)[:draft_vocab].sort().values
        d2t = draft_ids - torch.arange(draft_vocab, device=device)
    return draft, target, d2t, draft_ids


def time_ms(fn, device: str) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median")  # event-timed, not graph replays
    return wall_median_us(fn) / 1e3


def peak_extra_mb(fn, device: str) -> float | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def copy_gbs(nbytes: int, device: str) -> float:
    """Read + write rate of a copy of nbytes."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / (time_ms(lambda: dst.copy_(src), device) * 1e-3) / 1e9


def implementations(draft, target, d2t, draft_ids, compiled_plain) -> dict:
    runs = {
        "vocab_metrics": lambda: vocab_metrics(draft, target, 1.0, d2t=d2t),
        "vocab_metrics + CE/KL": lambda: vocab_metrics(draft, target, 1.0, d2t=d2t, divergence=True),
        "vocab_metrics greedy": lambda: vocab_metrics(draft, target, 0.0, d2t=d2t),
        "plain torch": lambda: plain_metrics(draft, target, draft_ids),
    }
    if compiled_plain is not None:
        runs["compile(plain torch)"] = lambda: compiled_plain(draft, target, draft_ids)
    return runs


def bench(rows: int, shapes, device: str, compile_plain: bool):
    table = []
    compiled_plain = torch.compile(plain_metrics, fullgraph=True, dynamic=False) if compile_plain else None
    for vocab, draft_vocab in shapes:
        draft, target, d2t, draft_ids = make_inputs(rows, vocab, draft_vocab, device)
        nbytes = draft.numel() * draft.element_size() + target.numel() * target.element_size()
        copy = copy_gbs(nbytes, device)
        for name, fn in implementations(draft, target, d2t, draft_ids, compiled_plain).items():
            ms = time_ms(fn, device)
            gbs = nbytes / (ms * 1e-3) / 1e9
            mb = peak_extra_mb(fn, device)
            table.append([f"{vocab} / {draft_vocab}", name, ms, "n/a" if mb is None else f"{mb:.0f}", gbs,
                          100 * gbs / copy])  # fmt: skip
    return table


def sweep_tiles(rows: int, vocab: int, device: str):
    """The kernel's (BLOCK_V, num_warps) at V = vocab, no map; the module default is the first row."""
    module = importlib.import_module("specdraft.ops.vocab_metrics.op")  # where the op reads its tiles
    defaults = (module.BLOCK_V, module.NUM_WARPS)
    draft, target, _, _ = make_inputs(rows, vocab, vocab, device)
    nbytes = 2 * draft.numel() * draft.element_size()
    copy = copy_gbs(nbytes, device)
    table = []
    for config in [defaults] + [c for c in TILES if c != defaults]:
        module.BLOCK_V, module.NUM_WARPS = config
        for divergence in (False, True):
            ms = time_ms(lambda d=divergence: vocab_metrics(draft, target, 1.0, divergence=d), device)
            gbs = nbytes / (ms * 1e-3) / 1e9
            table.append([*config, "yes" if divergence else "no", ms, gbs, 100 * gbs / copy])
    module.BLOCK_V, module.NUM_WARPS = defaults
    return table


def three_decimals_below_ten(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return str(value)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8192, help="T, rows of logits (default 8192)")
    parser.add_argument("--shapes", nargs="+", default=["32000", "128256", "128256/32000"],
                        help="V or V/Vd (a draft vocabulary of Vd through d2t)")  # fmt: skip
    parser.add_argument("--tiles", action="store_true", help="also sweep the kernel's tiles at each V")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile of the plain computation")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: a check of the script")
    args = parser.parse_args(argv)
    args.shapes = [tuple(int(v) for v in (s.split("/") * 2)[:2]) for s in args.shapes]
    for vocab, draft_vocab in args.shapes:
        if not 1 <= draft_vocab <= vocab:
            parser.error(f"shape {vocab}/{draft_vocab}: the draft vocabulary must be in [1, V]")
    if args.smoke:
        args.rows, args.shapes = 64, [(300, 300), (300, 120)]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("bench_vocab_metrics needs a CUDA device (or --smoke)")
        return
    from harness import device_name, emit  # imports triton

    header = f"{device_name() if device == 'cuda' else 'CPU smoke run'}; T = {args.rows}, bf16 logits, temperature 1"
    headers = ["V / Vd", "implementation", "ms", "peak extra MiB", "GB/s (logits read once)", "% of copy"]
    table = bench(args.rows, args.shapes, device, not args.no_compile)
    sections = [
        header,
        "### vocab_metrics vs plain torch\n\n" + markdown_table(headers, table, cell=three_decimals_below_ten),
    ]
    if not args.smoke:  # "V / Vd" as two config keys
        append_rows("vocab_metrics", [({"T": args.rows, "dtype": "bfloat16", "V": int(shape.split(" / ")[0]),
                                        "Vd": int(shape.split(" / ")[1]), "implementation": name},
                                       table_pairs(headers[2:], [values], 0)[0][1])
                                      for shape, name, *values in table])  # fmt: skip
    if args.tiles:
        tile_headers = ["BLOCK_V", "num_warps", "CE/KL", "ms", "GB/s", "% of copy"]
        for vocab in sorted({v for v, _ in args.shapes}):
            tiles = sweep_tiles(args.rows, vocab, device)
            sections.append(
                f"### tiles (V = {vocab}, no map)\n\n"
                + markdown_table(tile_headers, tiles, cell=three_decimals_below_ten)
            )
            if not args.smoke:
                append_table("vocab_metrics_tiles", tile_headers, tiles, config_columns=3,
                             config={"T": args.rows, "dtype": "bfloat16", "V": vocab})  # fmt: skip
    emit("bench_vocab_metrics", "\n\n".join(sections))


if __name__ == "__main__":
    main()
