"""Budgeted verification against plain decoding and fixed K, by batch size, on the
demo pair (greedy): decode tokens/s of plain decoding, fixed K = 1 and K = 3 chains,
and budgeted iterations (K = 3 drafts, a budget of B, 2B or 3B drafts per
iteration), each iteration compiled per configuration (CUDA: mode="reduce-overhead");
then the budget `step_costs.choose_budget` picks from those measured iteration times
and the fixed-K run's acceptance rates ("auto"), and how it compares with the best of
plain and fixed K. Every row's output is checked against plain decoding.

    python3 benchmarks/bench_budget.py                          # GPU, every batch size
    python3 benchmarks/bench_budget.py --batch-sizes 1 64 --json out.json
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
from specdraft.generation.step_costs import PLAIN, StepCosts, choose_budget, conditional_rates

K = 3
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
        plain, spec = build_decoders(device, max(k, 1), batch, compile, budget=budget)
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
            "spread": spread, "lossless": tokens == want,
        })  # fmt: skip
        log(f"B={batch} {mode} k={k} budget={budget}: {rate:,.0f} tok/s, {ms:.3f} ms/iteration")
        if profile:
            log(f"kernels of one iteration, B={batch} {mode} k={k} budget={budget}:\n"
                + iteration_kernels(decoder, prompts))  # fmt: skip
    return rows


def costs_of(rows, device_name: str) -> StepCosts:
    """StepCosts from measured rows: plain decoding's and each budget's iteration time
    at every batch size, and the fixed-K rows' pooled conditional acceptance rates."""
    seconds: dict[int, dict[int, float]] = {}
    accepted, tested = [0] * K, [0] * K
    for row in rows:
        batch = row["B"]
        if row["mode"] == "plain":
            seconds.setdefault(batch, {})[PLAIN] = row["ms_per_iteration"] / 1e3
        elif row["mode"] == "budget":
            seconds.setdefault(batch, {})[row["budget"]] = row["ms_per_iteration"] / 1e3
        elif row["k"] == K:
            accepted = [a + b for a, b in zip(accepted, row["accepted_per_position"], strict=True)]
            tested = [a + b for a, b in zip(tested, row["tested_per_position"], strict=True)]
    rates = conditional_rates(accepted, tested)
    if rates is None:
        raise ValueError("no fixed-K rows with every position tested: cannot estimate the acceptance rates")
    return StepCosts(seconds=seconds, k=K, rates=rates, device=device_name, pair="demo pair (EAGLE-3, greedy)")


def auto_row(rows, batch: int, costs: StepCosts) -> dict:
    """The budget choose_budget picks at `batch` and its measured rate, against the
    best of plain decoding and fixed K at that batch size (measured in the same run)."""
    here = [r for r in rows if r["B"] == batch]
    chosen = choose_budget(batch, costs)
    pick = next(r for r in here if (r["mode"] == "plain" if chosen == PLAIN else r["budget"] == chosen))
    baseline = max((r for r in here if r["mode"] in ("plain", "fixed")), key=lambda r: r["decode_tokens_per_s"])
    return {"B": batch, "chosen_budget": chosen, "decode_tokens_per_s": pick["decode_tokens_per_s"],
            "best_baseline": f"{baseline['mode']} k={baseline['k']}",
            "best_baseline_tokens_per_s": baseline["decode_tokens_per_s"],
            "vs_best": pick["decode_tokens_per_s"] / baseline["decode_tokens_per_s"]}  # fmt: skip


def write_costs(device_name: str | None) -> int:
    rows = [r for r in latest(read_rows("budget", RESULTS)) if r["config"].get("mode") != "auto"]
    device_name = device_name or rows[-1]["device"]
    flat = [{**r["config"], **r["metrics"]} for r in rows if r["device"] == device_name]
    costs = costs_of(flat, device_name)
    COSTS_FILE.write_text(costs.to_json())
    print(
        f"{sum(len(v) for v in costs.seconds.values())} iteration times at B = {sorted(costs.seconds)} -> {COSTS_FILE}"
    )
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=BATCH_SIZES)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per row (the median is reported)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--profile", action="store_true", help="log each row's iteration kernels (stderr)")
    parser.add_argument("--only", nargs="+", help="rows to run, as MODE:K:BUDGET_FRACTION (e.g. fixed:3 budget:3:1)")
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
    rows, start = [], time.perf_counter()
    for batch in batch_sizes:
        measured = measure_batch(device, batch, compile, max_new, repeats, args.profile, args.only)
        plain_rate = measured[0]["decode_tokens_per_s"]
        for r in measured:
            print(f"| {batch} | {r['mode']} | {r['k'] or ''} | {r['budget'] or ''} | {r['decode_tokens_per_s']:,.0f} | "
                  f"{r['decode_tokens_per_s'] / plain_rate:.2f}x | {r['ms_per_iteration']:.3f} | "
                  f"{r['verified_per_iteration']:.1f} | {r['acceptance_length']:.3f} | {r['spread']:.0%} | "
                  f"{'yes' if r['lossless'] else 'FAIL'} |", flush=True)  # fmt: skip
            if not args.smoke:
                config = {key: r[key] for key in ("B", "mode", "k", "budget")}
                config.update(max_new_tokens=max_new, repeats=repeats)
                metrics = {key: v for key, v in r.items() if key not in config}
                append_rows("budget", [(config, metrics)], device=name)
        rows += measured
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps({"device": name, "rows": rows}, indent=1))
        log(f"B={batch} done ({time.perf_counter() - start:.0f} s)")
    if args.only:
        return 0 if all(r["lossless"] for r in rows) else 1
    costs = costs_of(rows, name)
    print("\nauto: the budget choose_budget picks from this run's iteration times and acceptance rates\n")
    print("| B | chosen budget | decode tokens/s | best of plain / fixed K | its tokens/s | auto vs best |")
    print("|---|---|---|---|---|---|")
    for batch in batch_sizes:
        a = auto_row(rows, batch, costs)
        print(f"| {batch} | {a['chosen_budget']} | {a['decode_tokens_per_s']:,.0f} | {a['best_baseline']} | "
              f"{a['best_baseline_tokens_per_s']:,.0f} | {a['vs_best']:.3f} |")  # fmt: skip
    return 0 if all(r["lossless"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
