"""Draft trees against chains on the demo pair (the shipped 4 x 256 byte-level target
+ its EAGLE-3 head), greedy, B = 1: mean acceptance length (bonus included) and
decode tokens/s, each configuration's iteration compiled (CUDA: mode="reduce-overhead",
one CUDA graph per iteration), and plain decoding as the baseline. Every request is
one of the demo's Python prompts, decoded alone (B = 1) with --max-new-tokens new
tokens; the rows sum over all prompts. The greedy outputs of every row are checked
against plain decoding (a row that differs is marked FAIL). --temperature T samples
instead (prompt i seeded 1000 + i): acceptance lengths at T, no lossless check (one
sampled run is not a distribution; tests/generation/test_tree_sampling.py checks that).

    python benchmarks/bench_tree.py                       # chains D = 3, 5, 7; trees (D, 4, N), N = 8, 16, 32
    python benchmarks/bench_tree.py --device cpu --eager --temperature 0.7   # acceptance lengths at T = 0.7
    python benchmarks/bench_tree.py --smoke               # CPU, eager, two rows: checks the script
    python benchmarks/bench_tree.py --json out.json

Each run appends its rows to the `tree` table (benchmarks/record.py; not with --smoke).

Rows run in order of importance under --budget-s (default 400 s; each configuration
compiles its own graph); the rest are printed as skipped. A row that raises records
its error class and the bench goes on.
"""

import argparse
import json
import sys
import time

import torch
from record import append_rows

from specdraft.config import SamplingParams
from specdraft.demo import PROMPTS, build_decoders, compile_options, encode
from specdraft.models import attention, linear
from specdraft.proposers import TreeShape


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def drafts_of(text: str) -> tuple[int, TreeShape | None]:
    """ "D,K,N" as (depth, TreeShape), or (depth, None) for the chain (K = 1, N = D + 1)."""
    depth, topk, n = (int(x) for x in text.split(","))
    return depth, (None if topk == 1 and n == depth + 1 else TreeShape(depth, topk, n))


def configurations(smoke: bool, only=None):
    if only:
        return [("chain" if tree is None else "tree", depth, tree) for depth, tree in map(drafts_of, only)]
    if smoke:
        return [("chain", 3, None), ("tree", 3, TreeShape(3, 2, 6))]
    rows = [("chain", d, None) for d in (3, 5, 7)]
    rows += [("tree", d, TreeShape(d, 4, n)) for d in (5, 3, 7) for n in (16, 32, 8)]
    return rows


def warm_up(decoder, prompt, temperature: float) -> None:
    """Compile, then CUDA-graph warm-up and recording (the first iterations), with the
    timed runs' sampling: greedy and sampled batches compile different graphs, so a
    greedy warm-up would leave a sampled run's compile inside its decode time (as the
    first T = 0.7 GPU run did)."""
    sampling = None if temperature <= 0 else SamplingParams(torch.full((1,), temperature), torch.tensor([999]))
    decoder.generate([prompt], max_new_tokens=40, sampling=sampling)


def decode_all(decoder, prompts, max_new_tokens: int, temperature: float = 0.0):
    """Each prompt alone (B = 1): (tokens per prompt, passes, accepted drafts, decode tokens, decode seconds).
    temperature > 0: prompt i sampled with seed 1000 + i."""
    tokens, passes, accepted, decoded, seconds = [], 0, 0, 0, 0.0
    for i, prompt in enumerate(prompts):
        sampling = None
        if temperature > 0:
            sampling = SamplingParams(torch.full((1,), temperature), torch.tensor([1000 + i]))
        result = decoder.generate([prompt], max_new_tokens=max_new_tokens, sampling=sampling)
        stats = result.stats
        tokens.append(result.tokens[0].tolist())
        passes += int(stats.request_passes.sum())
        accepted += int(stats.accepted_per_position.sum())
        decoded += int((stats.num_generated - 1).clamp(min=0).sum())
        seconds += float(stats.decode_time_s)
    return tokens, passes, accepted, decoded, seconds


CONFIG_KEYS = ("drafts", "depth", "topk", "N")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--budget-s", type=float, default=400.0)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--eager", action="store_true", help="no compile (acceptance lengths on a CPU)")
    parser.add_argument("--json", help="write the rows as JSON")
    parser.add_argument("--only", nargs="+", metavar="D,K,N", help="just these rows (K = 1, N = D + 1: the chain)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample at this temperature (seeded per prompt) instead of greedy; the lossless "
                        "column then reads n/a: one sampled run is not a distribution")  # fmt: skip
    args = parser.parse_args()
    if not args.temperature >= 0:
        parser.error(f"--temperature must be >= 0, got {args.temperature}")
    sampled = args.temperature > 0
    device = torch.device(args.device)
    compile = False if args.smoke or args.eager else compile_options(args.device, True)
    prompts = encode(PROMPTS)
    max_new = 16 if args.smoke else args.max_new_tokens
    start = time.perf_counter()
    plain, _ = build_decoders(device, 1, 1, compile)
    warm_up(plain, prompts[0], args.temperature)
    want, plain_passes, _, plain_tokens, plain_s = decode_all(plain, prompts, max_new, args.temperature)
    plain_rate = plain_tokens / plain_s
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    mode = f"temperature {args.temperature} (seeds 1000 + prompt)" if sampled else "greedy"
    print(f"{name} (torch {torch.__version__}); demo pair, {mode}, B = 1, {len(prompts)} prompts x {max_new} tokens")
    print(f"plain decoding: {plain_passes} target passes, {plain_rate:,.0f} decode tokens/s\n")
    print("| drafts | depth | topk | N | acceptance length | target passes | decode tokens/s | speedup vs plain | "
          "compile s | lossless |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for label, depth, tree in configurations(args.smoke, args.only):
        topk, n = (1, depth + 1) if tree is None else (tree.topk, tree.num_verify_tokens)
        if time.perf_counter() - start > args.budget_s:
            print(f"| {label} | {depth} | {topk} | {n} | skipped (budget) | | | | | |")
            continue
        try:
            # Every decoder compiles the same `iteration` code: without a reset, the
            # ninth configuration of one process meets Dynamo's recompile limit (8).
            torch._dynamo.reset()
            t0 = time.perf_counter()
            _, decoder = build_decoders(device, depth, 1, compile, tree=tree)
            warm_up(decoder, prompts[0], args.temperature)
            compile_s = time.perf_counter() - t0
            got, passes, accepted, decoded, seconds = decode_all(decoder, prompts, max_new, args.temperature)
        except Exception as error:  # noqa: BLE001 - the row records it, the bench goes on
            print(f"| {label} | {depth} | {topk} | {n} | {type(error).__name__} | | | | | |")
            log(f"{label} {depth},{topk},{n}: {error!r}")
            continue
        length, rate = 1 + accepted / passes, decoded / seconds
        lossless = None if sampled else got == want
        row = {"drafts": label, "depth": depth, "topk": topk, "N": n, "acceptance_length": length, "passes": passes,
               "decode_tokens_per_s": rate, "speedup": rate / plain_rate, "compile_s": compile_s,
               "lossless": lossless}  # fmt: skip
        rows.append(row)
        verdict = "n/a" if lossless is None else "yes" if lossless else "FAIL"
        print(f"| {label} | {depth} | {topk} | {n} | {length:.3f} | {passes} | {rate:,.0f} | {rate / plain_rate:.2f}x | "
              f"{compile_s:.1f} | {verdict} |", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "plain_decode_tokens_per_s": plain_rate, "rows": rows}, f, indent=1)
    if not args.smoke:
        config = {
            "B": 1,
            "temperature": args.temperature,
            "eager": compile is False,
            "max_new_tokens": max_new,
            "attention": attention.ATTENTION_FORM,
            "small_linear": linear.SMALL_LINEAR_FORM,
        }  # SPECDRAFT_ATTENTION, SPECDRAFT_SMALL_LINEAR; rows before them ran "sdpa" or "fp32", and "blas"
        append_rows("tree", [({**{k: r[k] for k in CONFIG_KEYS}, **config},
                              {**{k: v for k, v in r.items() if k not in CONFIG_KEYS},
                               "plain_decode_tokens_per_s": plain_rate}) for r in rows], device=name)  # fmt: skip
    return 0 if all(r["lossless"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
