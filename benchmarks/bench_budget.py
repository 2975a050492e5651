"""Budgeted verification against plain decoding and fixed K, by batch size, on the
demo pair (greedy): decode tokens/s of plain decoding, fixed K = 1 and K = 3 chains,
budgeted iterations (K = 3 drafts, a budget of B, 2B or 3B drafts per
iteration; the budgets B and 2B with calibrated estimates, "budget-cal"), a (4, 4, 16) draft tree and that tree under a budget of B or 3B nodes
(generation/tree_budget.py), each iteration compiled per configuration (CUDA:
mode="reduce-overhead");
then the budget `step_costs.choose_budget` picks from those measured iteration times
and the fixed-K run's acceptance rates ("auto"), and how it compares with the best of
plain and fixed K. Every row's output is checked against plain decoding.

    python3 benchmarks/bench_budget.py                          # GPU, every batch size
    python3 benchmarks/bench_budget.py --batch-sizes 1 64 --json out.json
    python3 benchmarks/bench_budget.py --only fixed:3 tree:4 tree-budget:4:1 tree-budget:4:3
    python3 benchmarks/bench_budget.py --smoke                  # CPU, eager, a check of the script
    python benchmarks/bench_budget.py --write-costs             # the table -> the package's demo pair step costs

Rows go to the `budget` table (benchmarks/record.py; not with --smoke). --write-costs
(no GPU, nothing timed) builds the StepCosts of the newest rows of one device
(--device-name, default the newest row's) and writes
src/specdraft/generation/demo_pair_step_costs.json.
"""

import argparse
import json
import pathlib
import sys
import time

import torch
from bench_generate import kernel_list
from bench_tree import log
from record import RESULTS, append_rows, latest, read_rows

from specdraft.demo import PROMPTS, build_decoders, compile_options, encode
from specdraft.generation.step_costs import PLAIN, Choice, StepCosts, conditional_rates
from specdraft.proposers import TreeShape

K = 3
CALIBRATION = 0.2  # budget-cal rows: the budget's estimates calibrated (the EMA's newest pass weighing this)
CALIBRATED_FRACTIONS = (1, 2)
TREE = TreeShape(4, 4, 16)
TREE_BUDGET_FRACTIONS = (1, 3)  # nodes per iteration: B, 3B (of 15 B)
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
BUDGET_FRACTIONS = (1, 2, 3)  # budgets B, 2B, 3B (= K B: every draft)
COSTS_FILE = (
    pathlib.Path(__file__).resolve().parents[1] / "src" / "specdraft" / "generation" / "demo_pair_step_costs.json"
)


def run(decoder, prompts, max_new_tokens: int, repeats: int):
    """One warm-up call (compile, CUDA-graph recording), then `repeats` timed calls:
    (tokens, the median call's stats, its decode tokens/s, ms per iteration, spread)."""
    decoder.generate(prompts, max_new_tokens=max_new_tokens)
    results = [decoder.generate(prompts, max_new_tokens=max_new_tokens) for _ in range(repeats)]
    rates = [float(r.stats.decode_tokens_per_s) for r in results]
    median = sorted(range(repeats), key=rates.__getitem__)[repeats // 2]
    stats = results[median].stats
    ms = 1e3 * float(stats.decode_time_s) / max(int(stats.num_verify_passes), 1)
    spread = (max(rates) - min(rates)) / rates[median]
    return [t.tolist() for t in results[median].tokens], stats, rates[median], ms, spread


def configurations(batch: int, only=None):
    """(mode, drafts per request, budget) of every row at one batch size (only: those
    named MODE[:K[:BUDGET_FRACTION]], plain always)."""
    rows = [("plain", 0, None), ("fixed", 1, None), ("fixed", K, None)]
    rows += [("budget", K, max(1, round(fraction * batch))) for fraction in BUDGET_FRACTIONS]
    rows += [("budget-cal", K, max(1, round(fraction * batch))) for fraction in CALIBRATED_FRACTIONS]
    rows += [("tree", TREE.depth, None)]
    rows += [("tree-budget", TREE.depth, max(1, round(fraction * batch))) for fraction in TREE_BUDGET_FRACTIONS]
    if only is None:
        yield from rows
        return
    names = {f"{m}:{k}" + (f":{round(b / batch)}" if b else "") for m, k, b in rows}
    unknown = set(only) - names
    if unknown:
        raise SystemExit(f"--only: unknown rows {sorted(unknown)}; choose from {sorted(names)}")
    for m, k, b in rows:
        if m == "plain" or f"{m}:{k}" + (f":{round(b / batch)}" if b else "") in only:
            yield m, k, b


def iteration_kernels(decoder, prompts) -> str:
    """The CUDA kernels of one compiled iteration after a prefill of prompts (graph
    replays: cudaGraphLaunch on the CPU side), for --profile."""
    prompts, requests = decoder.requests(prompts, 64, None, None)
    with torch.no_grad():
        state = decoder.prefill(prompts, requests)

        def iteration():
            torch.compiler.cudagraph_mark_step_begin()
            return decoder.compiled["iteration"](state, requests)

        for _ in range(3):  # compile, warm up, record
            iteration()
        return kernel_list(iteration, calls=5)


def measure_batch(device, batch: int, compile, max_new: int, repeats: int, profile: bool = False,
                  only=None) -> list[dict]:  # fmt: skip
    prompts = encode([PROMPTS[i % len(PROMPTS)] for i in range(batch)])
    rows, want = [], None
    for mode, k, budget in configurations(batch, only):
        torch._dynamo.reset()  # every decoder compiles the same iteration code (recompile limit 8)
        tree = TREE if mode.startswith("tree") else None
        calibration = CALIBRATION if mode == "budget-cal" else None
        plain, spec = build_decoders(device, max(k, 1), batch, compile, budget=budget, tree=tree,
                                     calibration=calibration)  # fmt: skip
        decoder = plain if mode == "plain" else spec
        tokens, stats, rate, ms, spread = run(decoder, prompts, max_new, repeats)
        want = tokens if mode == "plain" else want
        passes = max(int(stats.num_verify_passes), 1)
        rows.append({
            "B": batch, "mode": mode, "k": k, "budget": budget, "decode_tokens_per_s": rate, "ms_per_iteration": ms,
            "acceptance_length": float(stats.mean_acceptance_length) if k else 1.0,
            "verified_per_iteration": float(stats.verified_per_request.sum()) / passes if k else 0.0,
            "accepted_per_position": stats.accepted_per_position.tolist() if k else [],
            "tested_per_position": stats.tested_per_position.tolist() if k else [],
            "spread": spread, "lossless": tokens == want, "tokens": tokens,
        })  # fmt: skip
        log(f"B={batch} {mode} k={k} budget={budget}: {rate:,.0f} tok/s, {ms:.3f} ms/iteration")
        if profile:
            log(f"kernels of one iteration, B={batch} {mode} k={k} budget={budget}:\n"
                + iteration_kernels(decoder, prompts))  # fmt: skip
    return rows


def costs_of(rows, device_name: str) -> StepCosts:
    """StepCosts from measured rows: each configuration's iteration time at every
    batch size (plain: PLAIN; fixed K: (K, B * K), the same drafts as the budget of
    every draft, whose own row replaces it where measured; budget b: (K, b)), and the
    fixed-K rows' pooled conditional acceptance rates."""
    seconds: dict[int, dict[Choice, float]] = {}
    accepted, tested = [0] * K, [0] * K
    for row in sorted(rows, key=lambda r: r["mode"] == "budget"):  # budget rows last: they replace
        batch, at = row["B"], seconds.setdefault(row["B"], {})
        if row["mode"] == "plain":
            at[PLAIN] = row["ms_per_iteration"] / 1e3
        elif row["mode"] == "fixed":
            at[Choice(row["k"], batch * row["k"])] = row["ms_per_iteration"] / 1e3
            if row["k"] == K:
                accepted = [a + b for a, b in zip(accepted, row["accepted_per_position"], strict=True)]
                tested = [a + b for a, b in zip(tested, row["tested_per_position"], strict=True)]
        elif row["mode"] == "budget":
            at[Choice(row["k"], row["budget"])] = row["ms_per_iteration"] / 1e3
    rates = conditional_rates(accepted, tested)
    if rates is None:
        raise ValueError("no fixed-K rows with every position tested: cannot estimate the acceptance rates")
    return StepCosts(seconds=seconds, rates=rates, device=device_name, pair="demo pair (EAGLE-3, greedy)")


def auto_row(device, batch: int, rows, compile, max_new: int, repeats: int, want) -> dict:
    """A decoder given the StepCosts of this batch size's rows, run: what it chose and
    measured, against the best of plain decoding and fixed K (same run)."""
    here = [r for r in rows if r["B"] == batch]
    costs = costs_of(here, "this run")
    prompts = encode([PROMPTS[i % len(PROMPTS)] for i in range(batch)])
    torch._dynamo.reset()
    _, decoder = build_decoders(device, K, batch, compile, budget=costs)
    tokens, stats, rate, ms, spread = run(decoder, prompts, max_new, repeats)
    baseline = max((r for r in here if r["mode"] in ("plain", "fixed")), key=lambda r: r["decode_tokens_per_s"])
    return {"B": batch, "mode": "auto", "k": decoder.k, "budget": decoder.budget, "decode_tokens_per_s": rate,
            "ms_per_iteration": ms, "acceptance_length": float(stats.mean_acceptance_length), "spread": spread,
            "lossless": tokens == want, "best_baseline": f"{baseline['mode']} k={baseline['k']}",
            "best_baseline_tokens_per_s": baseline["decode_tokens_per_s"],
            "vs_best": rate / baseline["decode_tokens_per_s"]}  # fmt: skip


def write_costs(device_name: str | None) -> int:
    rows = [r for r in latest(read_rows("budget", RESULTS)) if r["config"]["mode"] != "auto"]
    device_name = device_name or rows[-1]["device"]
    flat = [{**r["config"], **r["metrics"]} for r in rows if r["device"] == device_name]
    costs = costs_of(flat, device_name)
    COSTS_FILE.write_text(costs.to_json())
    count = sum(len(v) for v in costs.seconds.values())
    print(f"{count} iteration times at B = {sorted(costs.seconds)} -> {COSTS_FILE}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=BATCH_SIZES)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per row (the median is reported)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--profile", action="store_true", help="log each row's iteration kernels (stderr)")
    parser.add_argument("--only", nargs="+", help="rows to run, as MODE:K:BUDGET_FRACTION (e.g. fixed:3 "
                        "budget:3:1 tree:4 tree-budget:4:3)")  # fmt: skip
    parser.add_argument("--json", help="write the rows as JSON (after every batch size)")
    parser.add_argument("--write-costs", action="store_true", help=f"write {COSTS_FILE.name} from the table, then exit")
    parser.add_argument("--device-name", help="--write-costs: the device whose rows to use")
    args = parser.parse_args(argv)
    if args.write_costs:
        return write_costs(args.device_name)
    device = torch.device(args.device)
    compile = False if args.smoke else compile_options(args.device, True)
    batch_sizes = [1, 4] if args.smoke else args.batch_sizes
    max_new = 8 if args.smoke else args.max_new_tokens
    repeats = 1 if args.smoke else args.repeats
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    torch._logging.set_logs(perf_hints=True)  # a graph that falls back from CUDA graphs says why (stderr)
    print(f"{name} (torch {torch.__version__}); demo pair, greedy, {max_new} new tokens per request, median of "
          f"{repeats} timed calls\n")  # fmt: skip
    print("| B | mode | K | budget | decode tokens/s | vs plain | ms / iteration | verified / iteration | "
          "acceptance length | spread | lossless |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows, autos, start = [], [], time.perf_counter()
    for batch in batch_sizes:
        measured = measure_batch(device, batch, compile, max_new, repeats, args.profile, args.only)
        if not args.only:
            want = [r for r in measured if r["mode"] == "plain"][0]["tokens"]
            autos.append(auto_row(device, batch, measured, compile, max_new, repeats, want))
            log(
                f"B={batch} auto: k={autos[-1]['k']} budget={autos[-1]['budget']}, {autos[-1]['vs_best']:.3f}x the best"
            )
        plain_rate = measured[0]["decode_tokens_per_s"]
        for r in measured:
            print(f"| {batch} | {r['mode']} | {r['k'] or ''} | {r['budget'] or ''} | {r['decode_tokens_per_s']:,.0f} | "
                  f"{r['decode_tokens_per_s'] / plain_rate:.2f}x | {r['ms_per_iteration']:.3f} | "
                  f"{r['verified_per_iteration']:.1f} | {r['acceptance_length']:.3f} | {r['spread']:.0%} | "
                  f"{'yes' if r['lossless'] else 'FAIL'} |", flush=True)  # fmt: skip
        for r in measured + (autos[-1:] if not args.only else []):
            if not args.smoke:
                config = {key: r[key] for key in ("B", "mode", "k", "budget")}
                config.update(max_new_tokens=max_new, repeats=repeats)
                metrics = {key: v for key, v in r.items() if key not in config and key != "tokens"}
                append_rows("budget", [(config, metrics)], device=name)
        rows += [{key: v for key, v in r.items() if key != "tokens"} for r in measured]
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps({"device": name, "rows": rows, "auto": autos}, indent=1))
        log(f"B={batch} done ({time.perf_counter() - start:.0f} s)")
    if autos:
        print("\nauto: a decoder given this batch size's measured iteration times (StepCosts) and the fixed-K rows'"
              " acceptance rates, run\n")  # fmt: skip
        print("| B | chosen k | chosen budget | decode tokens/s | best of plain / fixed K | its tokens/s | auto vs best | "
              "lossless |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for a in autos:
            print(f"| {a['B']} | {a['k'] if a['budget'] else 'plain'} | {a['budget']} | {a['decode_tokens_per_s']:,.0f} | "
                  f"{a['best_baseline']} | {a['best_baseline_tokens_per_s']:,.0f} | {a['vs_best']:.3f} | "
                  f"{'yes' if a['lossless'] else 'FAIL'} |")  # fmt: skip
    return 0 if all(r["lossless"] for r in rows + autos) else 1


if __name__ == "__main__":
    sys.exit(main())
