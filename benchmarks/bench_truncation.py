"""Request truncation (issue 40) at B = 256, V = 152064, bf16 logits, every row
truncated, T = 0.7 and 1.0 (greedy rows cost nothing: no pass at all).

Two tables. `truncation`: ops.truncation_cut alone (a request's top-k / top-p / min-p
as one logit cut per row) against one read of the logits (`amax(-1)` compiled: the
floor) and two compiled sort-based baselines: torch.compile of this package's exact
reference (truncation_cut_reference, fp64 top-p sums) and of the usual sort-softmax-
cumsum formulation (`sort_cut` below, fp32 sums, as serving engines write it); the last
column counts rows whose cut differs from the exact reference's (only a top-p decision
within rounding of its boundary may). `truncated_sampling`: what issue 40's speed
targets are about, the samplers with the cut against the same samplers untruncated
(target: <= 2.5x) and against torch.compile of a sort-based pipeline (the sampler's
reference fed the sort-based cut; target: >= 3x slower than ours). Draft sampling:
truncation_cut then draft_sample over [B, V]; rejection sampling (K = 3): the cut of
the B x (K + 1) target rows then rejection_sample.

Times: median microseconds of a CUDA-graph replay (harness.time_us). A baseline that
torch.compile cannot build on this torch prints "failed: <error>" in its cell (torch
2.11's Inductor stopped on the exact reference's CUDA codegen once: "TypeError: list
indices must be integers or slices, not NoneType"); the others still run.

    python benchmarks/bench_truncation.py
    python benchmarks/bench_truncation.py --smoke        # CPU, tiny sizes: a check of the script
    python benchmarks/bench_truncation.py --tiles        # also the split path's tile sweep (table truncation_split_tiles)
    python benchmarks/bench_truncation.py --no-baselines # ours only (the baselines' compiles take minutes)
"""

import argparse
from functools import partial

import torch
from record import append_table
from tables import markdown_table, time_us

import specdraft.ops.sampling.truncation.op as truncation_launch
from specdraft.ops import draft_sample, rejection_sample, truncation_cut
from specdraft.ops.sampling.draft import draft_sample_reference
from specdraft.ops.sampling.rejection import rejection_sample_reference
from specdraft.ops.sampling.truncation import truncation_cut_reference

# (name, top_k, top_p, min_p); off: 0, 1.0, 0.0.
PARAMS = (
    ("top-k 50", 50, 1.0, 0.0),
    ("top-p 0.9", 0, 0.9, 0.0),
    ("min-p 0.05", 0, 1.0, 0.05),
    ("top-k 20 + top-p 0.9", 20, 0.9, 0.0),
    ("top-k 50 + top-p 0.9 + min-p 0.05", 50, 0.9, 0.05),
)
SAMPLING_PARAMS = (PARAMS[1], PARAMS[3], PARAMS[4])
TEMPERATURES = (0.7, 1.0)
NUM_SPEC = 3


def blocked_cumsum(x, width: int = 128):
    """x.cumsum(-1) in two levels (within tiles of `width`, then the tiles' totals):
    torch 2.11's Inductor failed to generate its split-scan Triton kernel for a plain
    cumsum over 256 rows of 152k ("TypeError: list indices must be integers or slices,
    not NoneType"), and 1,024 rows compiled; the tiles give the scan many rows."""
    rows, length = x.shape
    padded = torch.nn.functional.pad(x, (0, -length % width)).view(rows, -1, width)
    inner = padded.cumsum(-1)
    totals = inner[..., -1]
    return (inner + (totals.cumsum(-1) - totals)[..., None]).view(rows, -1)[:, :length]


def sort_cut(logits, temperature, top_k, top_p, min_p):
    """The usual sort-based truncation as one logit cut per row: sort, the k-th value,
    softmax of what top-k keeps, fp32 cumulative sum for top-p, min-p against the
    largest probability. A timing baseline, not an oracle (its fp32 sums and tie
    handling are the ones truncation_cut_reference's docstring improves on)."""
    x = logits.float()
    values = x.sort(-1, descending=True).values
    vocab = x.shape[-1]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k.long(), vocab)
    cut_k = values.gather(-1, (k - 1)[:, None])
    kept = torch.where(values >= cut_k, values, float("-inf"))
    probs = torch.softmax(kept / temperature[:, None], -1)
    mass_before = blocked_cumsum(probs) - probs
    cut_p = torch.where(mass_before < top_p[:, None], values, float("inf")).amin(-1, keepdim=True)
    cut_min = values[:, :1] + temperature[:, None] * torch.log(min_p[:, None])
    return torch.maximum(torch.maximum(cut_k, cut_p), cut_min)[:, 0]


def make_inputs(batch, vocab, temperature, top_k, top_p, min_p, device, rows=1):
    g = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(batch * rows, vocab, device=device, generator=g) * 3.0).to(torch.bfloat16)
    full = lambda value, dtype=torch.float32: torch.full((batch * rows,), value, dtype=dtype, device=device)  # noqa: E731
    return logits, full(temperature), full(top_k, torch.int32), full(top_p), full(min_p)


def compiled(fn):
    return torch.compile(fn, fullgraph=True, dynamic=False)


SKIP_BASELINES = False  # --no-baselines


def try_time(fn, device):
    """(microseconds, None) or (None, the first line of why torch.compile failed)."""
    if SKIP_BASELINES:
        return None, "not run (--no-baselines)"
    try:
        return time_us(fn, device), None
    except Exception as error:  # a baseline that does not build: say so, go on
        torch._dynamo.reset()
        return None, f"failed: {type(error).__name__}: {str(error).splitlines()[0][:80] if str(error) else ''}"


def ratio_cell(slow, fast, error):
    return error if slow is None else f"{slow / fast:.2f}x"


def bench_cut(batch, vocab, device):
    exact_ref, usual_ref = compiled(truncation_cut_reference), compiled(sort_cut)
    read = compiled(lambda x: x.amax(-1))
    table = []
    for temperature in TEMPERATURES:
        for name, top_k, top_p, min_p in PARAMS:
            args = make_inputs(batch, vocab, temperature, top_k, top_p, min_p, device)
            op_us = time_us(lambda a=args: truncation_cut(*a), device)
            floor_us = time_us(lambda a=args: read(a[0]), device)
            exact_us, exact_error = try_time(lambda a=args: exact_ref(*a), device)
            usual_us, usual_error = try_time(lambda a=args: usual_ref(*a), device)
            oracle = truncation_cut_reference(*args)  # eager: the rows differing need no compile
            differ = int((truncation_cut(*args) != oracle).sum())
            table.append([batch, vocab, f"T = {temperature}", name, op_us, floor_us, f"{op_us / floor_us:.2f}x",
                          exact_us if exact_us is not None else exact_error, ratio_cell(exact_us, op_us, exact_error),
                          usual_us if usual_us is not None else usual_error, ratio_cell(usual_us, op_us, usual_error),
                          differ])  # fmt: skip
    return table


def sampler_args(batch, vocab, temperature, top_k, top_p, min_p, device):
    """(draft inputs, rejection inputs): random bf16 logits, seeded requests."""
    seeds = torch.arange(batch, device=device) * 7919 + 1
    positions = torch.arange(batch, device=device) * 5
    logits, temp, k, p, m = make_inputs(batch, vocab, temperature, top_k, top_p, min_p, device)
    draft = (logits, temp, seeds, positions, (k, p, m))
    target, _, k1, p1, m1 = make_inputs(batch, vocab, temperature, top_k, top_p, min_p, device, NUM_SPEC + 1)
    draft_probs = torch.softmax(torch.randn(batch, NUM_SPEC, vocab, device=device), -1)
    drafts = torch.randint(0, vocab, (batch, NUM_SPEC), device=device)
    num_draft = torch.full((batch,), NUM_SPEC, device=device)
    rejection = (drafts, num_draft, draft_probs, target.view(batch, NUM_SPEC + 1, vocab), temp, seeds, positions,
                 (temp.repeat_interleave(NUM_SPEC + 1), k1, p1, m1))  # fmt: skip
    return draft, rejection


def draft_truncated(logits, temp, seeds, positions, cut_params, cut_fn=truncation_cut, sample=draft_sample):
    return sample(logits, temp, seeds, positions, logit_cut=cut_fn(logits, temp, *cut_params))


def rejection_truncated(drafts, num, probs, target, temp, seeds, positions, cut_params, cut_fn=truncation_cut,
                        sample=rejection_sample):  # fmt: skip
    batch, rows, vocab = target.shape
    cut = cut_fn(target.view(batch * rows, vocab), *cut_params).view(batch, rows)
    return sample(drafts, num, probs, target, temp, seeds, positions, logit_cut=cut)


def bench_sampling(batch, vocab, device):
    table = []
    pipelines = {
        "draft": (draft_sample, draft_truncated, draft_sample_reference),
        "rejection": (rejection_sample, rejection_truncated, rejection_sample_reference),
    }
    for sampler, (plain_op, truncated_op, reference) in pipelines.items():
        exact = compiled(lambda *a, f=truncated_op, r=reference: f(*a, cut_fn=truncation_cut_reference, sample=r))
        usual = compiled(lambda *a, f=truncated_op, r=reference: f(*a, cut_fn=sort_cut, sample=r))
        for temperature in TEMPERATURES:
            for name, top_k, top_p, min_p in SAMPLING_PARAMS:
                draft, rejection = sampler_args(batch, vocab, temperature, top_k, top_p, min_p, device)
                args = draft if sampler == "draft" else rejection
                op_us = time_us(partial(truncated_op, *args), device)
                plain_us = time_us(partial(plain_op, *args[:-1]), device)
                exact_us, exact_error = try_time(partial(exact, *args), device)
                usual_us, usual_error = try_time(partial(usual, *args), device)
                table.append([sampler, batch, vocab, f"T = {temperature}", name, op_us, plain_us,
                              f"{op_us / plain_us:.2f}x",
                              exact_us if exact_us is not None else exact_error,
                              ratio_cell(exact_us, op_us, exact_error),
                              usual_us if usual_us is not None else usual_error,
                              ratio_cell(usual_us, op_us, usual_error)])  # fmt: skip
    return table


TILE_NAMES = ("CHUNK", "WINDOW_BINS", "WINDOW_WARPS", "CAPACITY", "NUM_WARPS")
TILE_CONFIGS = (
    (4096, 64, 4, 4096, 8),
    (4096, 64, 8, 4096, 8),
    (4096, 32, 4, 4096, 8),
    (4096, 128, 4, 4096, 8),
    (2048, 64, 4, 4096, 4),
    (8192, 64, 8, 4096, 8),
    (4096, 64, 4, 2048, 8),
)


def sweep_tiles(batch, vocab, device):
    """truncation_cut's split path (op.py's launch constants), T = 1, three parameter
    sets, B and B x (K + 1) rows; the first row of each set is the module's defaults.
    "rows to the search": rows split.py left to kernel.py's per-row search."""
    defaults = tuple(getattr(truncation_launch, name) for name in TILE_NAMES)
    table = []
    for rows in (1, NUM_SPEC + 1):
        for name, top_k, top_p, min_p in (PARAMS[0], PARAMS[1], PARAMS[4]):
            args = make_inputs(batch, vocab, 1.0, top_k, top_p, min_p, device, rows)
            oracle = truncation_cut_reference(*args)
            for config in (defaults, *(c for c in TILE_CONFIGS if c != defaults)):
                for attr, value in zip(TILE_NAMES, config, strict=True):
                    setattr(truncation_launch, attr, value)
                differ = int((truncation_cut(*args) != oracle).sum())
                searched = int((truncation_launch.split_cut(*args)[1] == 0).sum())
                table.append([name, batch * rows, *config, time_us(partial(truncation_cut, *args), device),
                              searched, differ])  # fmt: skip
    for attr, value in zip(TILE_NAMES, defaults, strict=True):
        setattr(truncation_launch, attr, value)
    return table


CUT_HEADERS = ["B", "V", "temperature", "truncation", "op us", "floor us (one read)", "x floor",
               "compile(exact ref) us", "compile(exact ref) / op", "compile(sort_cut) us", "compile(sort_cut) / op",
               "rows differing from the exact ref"]  # fmt: skip
SAMPLING_HEADERS = ["sampler", "B", "V", "temperature", "truncation", "truncated us (cut + sampler)",
                    "untruncated us", "truncated / untruncated", "compile(exact ref pipeline) us",
                    "compile(exact ref pipeline) / op", "compile(sort_cut pipeline) us",
                    "compile(sort_cut pipeline) / op"]  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=152_064)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: a check of the script")
    parser.add_argument("--tiles", action="store_true", help="also the split path's tile sweep (CUDA)")
    parser.add_argument("--no-baselines", action="store_true", help="skip the compiled sort-based baselines")
    args = parser.parse_args(argv)
    global SKIP_BASELINES
    SKIP_BASELINES = args.no_baselines
    device = "cuda"
    if args.smoke:
        device, args.batch, args.vocab = "cpu", 4, 1000
    elif not torch.cuda.is_available():
        print("bench_truncation needs a CUDA device (or --smoke)")
        return
    cut_table = bench_cut(args.batch, args.vocab, device)
    sampling_table = bench_sampling(args.batch, args.vocab, device)
    text = (f"### truncation_cut\n\n{markdown_table(CUT_HEADERS, cut_table)}\n\n"
            f"### truncated sampling (K = {NUM_SPEC} for rejection)\n\n{markdown_table(SAMPLING_HEADERS, sampling_table)}")  # fmt: skip
    if device == "cuda":
        from harness import copy_bandwidth_gbs, device_name, emit

        config = {"dtype": "bfloat16"}
        append_table("truncation", CUT_HEADERS, cut_table, config_columns=4, config=config)
        append_table("truncated_sampling", SAMPLING_HEADERS, sampling_table, config_columns=5, config=config)
        if args.tiles:
            tiles = sweep_tiles(args.batch, args.vocab, device)
            headers = [
                "truncation",
                "rows",
                *TILE_NAMES,
                "us",
                "rows to the search",
                "rows differing from the exact ref",
            ]
            append_table("truncation_split_tiles", headers, tiles, config_columns=7, config=config)
            text += f"\n\n### truncation_cut's split path, tiles (T = 1.0)\n\n{markdown_table(headers, tiles)}"
        emit("bench_truncation", f"{device_name()}; copy {copy_bandwidth_gbs():.0f} GB/s; bf16 logits\n\n{text}")
    else:
        print(f"CPU smoke run; B = {args.batch}, V = {args.vocab}, bf16 logits\n\n{text}")


if __name__ == "__main__":
    main()
