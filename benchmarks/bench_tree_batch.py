"""Draft trees against chains by batch size on the demo pair (greedy): decode
tokens/s of plain decoding, chains and trees at B = 1, 2, 4, ... 64, every
configuration's iteration compiled per batch size (CUDA: mode="reduce-overhead").
The demo's prompts are cycled to fill each batch and decoded together, --max-new-tokens
each; every row's output is checked against plain decoding (FAIL when it differs).
specdraft.generation.default_drafts picks tree or chain by batch size from this table.

    python3 benchmarks/bench_tree_batch.py                            # GPU
    python3 benchmarks/bench_tree_batch.py --batch-sizes 1 64 --configs 5,1,6 5,4,32
    python3 benchmarks/bench_tree_batch.py --smoke                    # CPU, eager, a check of the script
    python benchmarks/bench_tree_batch.py --write-drafts   # the table's rows -> the package's DEMO_PAIR_DRAFTS

Batch sizes run in the order given under --budget-s; each row is appended to the
`tree_batch` table (benchmarks/record.py; not with --smoke) and the JSON (--json) is
rewritten as it is measured, so a run cut short keeps what it measured.
--write-drafts (no GPU, nothing timed) writes the rows `DEMO_PAIR_DRAFTS` is chosen from
(`demo_pair_rows` of the table) to src/specdraft/generation/demo_pair_drafts.json.
"""

import argparse
import json
import pathlib
import sys
import time

import torch
from bench_generate import kernel_profile
from bench_tree import drafts_of, log
from record import RESULTS, append_rows, latest, read_rows

from specdraft.demo import PROMPTS, build_decoders, compile_options, encode

CONFIGS = ["3,1,4", "5,1,6", "3,4,8", "5,4,16"]
BATCH_SIZES = [1, 64, 8, 32, 2, 16, 4]
CONFIG_KEYS = ("B", "drafts", "depth", "topk", "N")
DRAFTS_FILE = pathlib.Path(__file__).resolve().parents[1] / "src" / "specdraft" / "generation" / "demo_pair_drafts.json"


def run(decoder, prompts, max_new_tokens: int, repeats: int, profile: bool = False):
    """(tokens per request, decode tokens/s, acceptance length, ms per iteration, spread):
    one warm-up call of the timed length (compile, then CUDA-graph trees' warm-up and
    recording in its first two iterations), then `repeats` timed calls; the median
    call's rate and iteration time, and (max - min) / median of the rates. One timed
    call of ~100 iterations is 40-200 ms of GPU time: a single hiccup moves it."""
    decoder.generate(prompts, max_new_tokens=max_new_tokens)
    if profile:  # kernels of one 16-token call, ~16 / acceptance length iterations
        log(f"kernels of generate(B = {len(prompts)}, 16 tokens), K = {decoder.k}:\n"
            + kernel_profile(lambda: decoder.generate(prompts, max_new_tokens=16), calls=1))  # fmt: skip
    results = [decoder.generate(prompts, max_new_tokens=max_new_tokens) for _ in range(repeats)]
    rates = [float(r.stats.decode_tokens_per_s) for r in results]
    median = sorted(range(repeats), key=rates.__getitem__)[repeats // 2]
    stats = results[median].stats
    ms_per_iteration = 1e3 * float(stats.decode_time_s) / max(int(stats.num_verify_passes), 1)
    length = float(stats.mean_acceptance_length) if decoder.proposer is not None else 1.0
    spread = (max(rates) - min(rates)) / rates[median]
    return [t.tolist() for t in results[median].tokens], rates[median], length, ms_per_iteration, spread


def demo_pair_rows(rows) -> list[dict]:
    """The rows DEMO_PAIR_DRAFTS is chosen from: each configuration's newest row, not
    profiled; at each B only the rows of the most timed calls (medians replace single
    calls)."""
    rows = [r for r in latest(rows) if not r["config"]["profile"]]
    repeats = {}
    for r in rows:
        repeats[r["config"]["B"]] = max(repeats.get(r["config"]["B"], 0), r["config"]["repeats"])
    return [r for r in rows if r["config"]["repeats"] == repeats[r["config"]["B"]]]


def write_drafts() -> int:
    keep = ("decode_tokens_per_s", "plain_tokens_per_s", "lossless")
    rows = [{**r["config"], **{k: r["metrics"][k] for k in keep}, **{k: r[k] for k in ("device", "commit", "date")}}
            for r in demo_pair_rows(read_rows("tree_batch", RESULTS))]  # fmt: skip
    rows.sort(key=lambda r: (r["B"], r["depth"], r["topk"], r["N"]))
    lines = ",\n".join("  " + json.dumps(r) for r in rows)  # one row a line
    DRAFTS_FILE.write_text(f'{{"source": "benchmarks/results/tree_batch.jsonl",\n "rows": [\n{lines}\n]}}\n')
    print(f"{len(rows)} rows -> {DRAFTS_FILE}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=BATCH_SIZES)
    parser.add_argument("--configs", nargs="+", default=CONFIGS, metavar="D,K,N", help="K = 1, N = D + 1: a chain")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per row (the median is reported)")
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--profile", action="store_true", help="log each row's CUDA kernels (stderr)")
    parser.add_argument("--json", help="write the rows as JSON (after every row)")
    parser.add_argument(
        "--write-drafts", action="store_true", help=f"write {DRAFTS_FILE.name} from the table, then exit"
    )
    args = parser.parse_args(argv)
    if args.write_drafts:
        return write_drafts()
    device = torch.device(args.device)
    compile = False if args.smoke else compile_options(args.device, True)
    batch_sizes, configs = ([1, 2], ["3,1,4", "3,4,8"]) if args.smoke else (args.batch_sizes, args.configs)
    max_new = 8 if args.smoke else args.max_new_tokens
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    # Any graph that falls back from CUDA graphs says why in the log (stderr).
    torch._logging.set_logs(perf_hints=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name} (torch {torch.__version__}); demo pair, greedy, {max_new} new tokens per request, "
          f"median of {args.repeats} timed calls\n")  # fmt: skip
    print("| B | drafts | depth | topk | N | acceptance length | decode tokens/s | vs plain | ms / iteration | "
          "spread | lossless |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    start, rows = time.perf_counter(), []
    for batch in batch_sizes:
        prompts = encode([PROMPTS[i % len(PROMPTS)] for i in range(batch)])
        if time.perf_counter() - start > args.budget_s:
            print(f"| {batch} | skipped (budget) | | | | | | | | | |")
            continue
        torch._dynamo.reset()  # every decoder compiles the same iteration code (recompile limit 8)
        plain, _ = build_decoders(device, 1, batch, compile)
        want, plain_rate, _, plain_ms, plain_spread = run(plain, prompts, max_new, args.repeats, args.profile)
        print(f"| {batch} | plain | | | | 1 | {plain_rate:,.0f} | 1.00x | {plain_ms:.3f} | {plain_spread:.0%} | |",
              flush=True)  # fmt: skip
        for text in configs:
            depth, tree = drafts_of(text)
            topk, n = (1, depth + 1) if tree is None else (tree.topk, tree.num_verify_tokens)
            label = "chain" if tree is None else "tree"
            torch._dynamo.reset()
            try:
                _, decoder = build_decoders(device, depth, batch, compile, tree=tree)
                got, rate, length, ms, spread = run(decoder, prompts, max_new, args.repeats, args.profile)
            except Exception as error:  # noqa: BLE001 - the row records it, the bench goes on
                print(f"| {batch} | {label} | {depth} | {topk} | {n} | {type(error).__name__} | | | | | |")
                log(f"B={batch} {text}: {error!r}")
                continue
            rows.append({"B": batch, "drafts": label, "depth": depth, "topk": topk, "N": n,
                         "acceptance_length": length, "decode_tokens_per_s": rate, "plain_tokens_per_s": plain_rate,
                         "speedup": rate / plain_rate, "ms_per_iteration": ms, "plain_ms_per_iteration": plain_ms,
                         "spread": spread, "lossless": got == want})  # fmt: skip
            print(f"| {batch} | {label} | {depth} | {topk} | {n} | {length:.3f} | {rate:,.0f} | "
                  f"{rate / plain_rate:.2f}x | {ms:.3f} | {spread:.0%} | {'yes' if got == want else 'FAIL'} |",
                  flush=True)  # fmt: skip
            log(f"B={batch} {text}: {rate:,.0f} tok/s ({time.perf_counter() - start:.0f} s)")
            if not args.smoke:
                config = {k: rows[-1][k] for k in CONFIG_KEYS}
                config.update(max_new_tokens=max_new, repeats=args.repeats, profile=args.profile)
                metrics = {k: v for k, v in rows[-1].items() if k not in CONFIG_KEYS}
                append_rows("tree_batch", [(config, metrics)], device=name)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"device": name, "max_new_tokens": max_new, "rows": rows}, f, indent=1)
    return 0 if all(r["lossless"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
