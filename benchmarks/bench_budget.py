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
                                                                # (and its tree costs, demo_pair_tree_costs.json)
    python3 benchmarks/bench_budget.py --side-by-side --batch-sizes 1 16 256   # one process, interleaved rounds

--side-by-side (table `budget_side_by_side`): plain decoding, fixed K = 1 and 3 and a
budget of 2B drafts compiled once each in one process and timed in interleaved rounds;
a StepCosts table from those rounds; "auto", a decoder given that table; then every
decoder, auto included, timed again side by side (the rows). --trees: plain, fixed K
= 3, the (4, 4, 16) tree whole and under budgets of B and 3B nodes, and auto from a
TreeCosts table of those rounds. --both: plain, fixed K = 1 and 3, a budget of 2B
drafts, the tree whole and under 3B nodes, and auto a ChainOrTree of the StepCosts and
the TreeCosts of those rounds (per run the chain or the tree, whichever predicts
faster). --control: a second copy of the configuration fastest in the first rounds
runs in the second rounds too (row "control"), its rate over the first copy's the
noise floor of a paired ratio. A configuration measures
up to 30% apart in two processes on this launch-bound pair, so only rates of the same
rounds are compared.

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
from specdraft.generation import ChainOrTree, SpeculativeDecoder
from specdraft.generation.step_costs import PLAIN, Choice, StepCosts, conditional_rates
from specdraft.generation.tree_costs import TreeCosts
from specdraft.models import linear
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
    batch size (plain: PLAIN; budget b: (K, b); fixed K: (K, B * K), the budget of
    every draft, which the decoder runs as the fixed-K iteration, so its row replaces
    a budget row of B * K), and the fixed-K rows' pooled conditional acceptance
    rates."""
    seconds: dict[int, dict[Choice, float]] = {}
    accepted, tested = [0] * K, [0] * K
    for row in sorted(rows, key=lambda r: r["mode"] == "fixed"):  # fixed rows last: they replace
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


TREE_COSTS_FILE = COSTS_FILE.with_name("demo_pair_tree_costs.json")


def tree_costs_of(rows, device_name: str) -> TreeCosts:
    """TreeCosts of TREE from measured rows: plain decoding as budget 0 (1 token a
    request and iteration), the whole tree as None, a tree budget as its nodes; the
    seconds per iteration and acceptance length of each."""
    table: dict[int, dict] = {}
    for row in rows:
        at = table.setdefault(row["B"], {})
        tokens = row["acceptance_length"]
        if row["mode"] == "plain":
            at[0] = (row["ms_per_iteration"] / 1e3, 1.0)
        elif row["mode"] == "tree" and row["k"] == TREE.depth:
            at[None] = (row["ms_per_iteration"] / 1e3, tokens)
        elif row["mode"] == "tree-budget" and row["k"] == TREE.depth:
            at[row["budget"]] = (row["ms_per_iteration"] / 1e3, tokens)
    table = {b: row for b, row in table.items() if any(k != 0 for k in row)}
    return TreeCosts(shape=TREE, rows=table, device=device_name, pair="demo pair (EAGLE-3 trees, greedy)")


# (mode, drafts per request or tree depth, budget as a multiple of B); "chains" is
# what a StepCosts table chooses from, "trees" what a TreeCosts table does (fixed K = 3
# beside it: the issue compares with the best of plain, fixed K and the tree).
SIDE_BY_SIDE = {
    "chains": (("plain", 0, None), ("fixed", 1, None), ("fixed", K, None), ("budget", K, 2)),
    "trees": (("plain", 0, None), ("fixed", K, None), ("tree", TREE.depth, None), ("tree-budget", TREE.depth, 1),
              ("tree-budget", TREE.depth, 3)),
    "both": (("plain", 0, None), ("fixed", 1, None), ("fixed", K, None), ("budget", K, 2), ("tree", TREE.depth, None),
             ("tree-budget", TREE.depth, 3)),
}  # fmt: skip
CHOICES = {"chains": ("plain", "fixed"), "trees": ("plain", "tree", "tree-budget"),
           "both": ("plain", "fixed", "budget", "tree", "tree-budget")}  # what auto can run  # fmt: skip


def timed_run(decoder, prompts, max_new: int) -> tuple[list, object]:
    result = decoder.generate(prompts, max_new_tokens=max_new)
    return [t.tolist() for t in result.tokens], result.stats


def interleaved(decoders: dict, prompts, max_new: int, rounds: int) -> dict:
    """`rounds` rounds of one generate call per decoder, the order rotated every round
    (so that no configuration always runs first or after the same one): {name: [stats
    of each round]}."""
    names, runs = list(decoders), {name: [] for name in decoders}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs[name].append(timed_run(decoders[name], prompts, max_new))
    return runs


def summary(batch: int, name: str, k: int, budget, runs, want) -> dict:
    """A side-by-side row: the median round's decode tokens/s, its ms per iteration,
    the spread between the rounds' quartiles, and whether every round was lossless."""
    rates = sorted(float(stats.decode_tokens_per_s) for _, stats in runs)
    median = rates[len(rates) // 2]
    stats = next(stats for _, stats in runs if float(stats.decode_tokens_per_s) == median)
    passes = max(int(stats.num_verify_passes), 1)
    quartiles = (rates[(3 * len(rates)) // 4] - rates[len(rates) // 4]) / median
    return {
        "B": batch, "mode": name, "k": k, "budget": budget, "decode_tokens_per_s": median,
        "ms_per_iteration": 1e3 * float(stats.decode_time_s) / passes,
        "acceptance_length": float(stats.mean_acceptance_length) if k else 1.0,
        "accepted_per_position": stats.accepted_per_position.tolist() if k else [],
        "tested_per_position": stats.tested_per_position.tolist() if k else [],
        "quartile_spread": quartiles, "lossless": all(tokens == want for tokens, _ in runs),
        "round_rates": [float(stats.decode_tokens_per_s) for _, stats in runs],
    }  # fmt: skip


def row_name(row: dict) -> str:
    return row["mode"] + (f" k={row['k']}" if row["k"] else "") + (f" budget={row['budget']}" if row["budget"] else "")


def ratio(row: dict, other: dict) -> dict:
    """`row`'s rate over `other`'s: the medians' ratio, and paired per round (both ran
    in each round), median and quartiles."""
    paired = sorted(a / b for a, b in zip(row["round_rates"], other["round_rates"], strict=True))
    return {"best": row_name(other), "medians": row["decode_tokens_per_s"] / other["decode_tokens_per_s"],
            "paired": paired[len(paired) // 2],
            "paired_quartiles": [paired[len(paired) // 4], paired[(3 * len(paired)) // 4]]}  # fmt: skip


def against(auto: dict, rows: list[dict], modes) -> dict:
    """Auto's rate over the best row of `modes` (`ratio`)."""
    return ratio(auto, max((r for r in rows if r["mode"] in modes), key=lambda r: r["decode_tokens_per_s"]))


def side_by_side_batch(
    device, batch: int, compile, max_new: int, rounds: int, kind: str = "chains", control: bool = False
) -> list[dict]:
    """The configurations of SIDE_BY_SIDE[kind], each compiled once, in one process
    and timed in interleaved rounds; a table from those rounds (chains: StepCosts,
    trees: TreeCosts of TREE); a decoder given that table ("auto") compiled too; then
    every decoder, auto included, timed again in interleaved rounds (the rows
    reported). Auto's row says what it ran and its rate against the best of what it
    can choose from (`vs_choices`) and of plain, fixed K and the tree (`vs_best`),
    both from the same rounds. `control`: a second copy of the configuration fastest
    in the first rounds, built and compiled as it was, runs in the second rounds too
    (mode "control"); its rate over the original's measures how far two copies of one
    iteration read apart in these rounds."""
    from specdraft.demo import run_as

    prompts = encode([PROMPTS[i % len(PROMPTS)] for i in range(batch)])
    torch._dynamo.reset()
    decoders, shapes = {}, {}
    for mode, k, fraction in SIDE_BY_SIDE[kind]:
        budget = None if fraction is None else fraction * batch
        name = mode if mode == "plain" else f"{mode} k={k}" + ("" if budget is None else f" budget={budget}")
        decoders[name], shapes[name] = side_by_side_decoder(device, batch, compile, mode, k, budget), (mode, k, budget)
        timed_run(decoders[name], prompts, max_new)  # compile, record the CUDA graphs
    want = timed_run(decoders["plain"], prompts, max_new)[0]
    first = interleaved(decoders, prompts, max_new, rounds)
    measured = [summary(batch, *shapes[name], first[name], want) for name in decoders]
    if kind == "trees":
        _, decoders["auto"] = build_decoders(device, TREE.depth, batch, compile, tree=TREE,
                                             budget=tree_costs_of(measured, "this run"))  # fmt: skip
    elif kind == "both":
        decoders["auto"] = chain_or_tree(device, batch, compile, measured)
    else:
        _, decoders["auto"] = build_decoders(device, K, batch, compile, budget=costs_of(measured, "this run"))
    timed_run(decoders["auto"], prompts, max_new)
    shapes["auto"] = ("auto", TREE.depth if kind == "trees" else K, None)
    if control:
        fastest = max(measured, key=lambda r: r["decode_tokens_per_s"])
        copied = next(name for name in shapes if shapes[name] == (fastest["mode"], fastest["k"], fastest["budget"]))
        decoders["control"] = side_by_side_decoder(device, batch, compile, *shapes[copied])
        timed_run(decoders["control"], prompts, max_new)
        shapes["control"] = ("control", *shapes[copied][1:])
    second = interleaved(decoders, prompts, max_new, rounds)
    rows = [summary(batch, *shapes[name], second[name], want) for name in decoders]
    if control:  # the last row, after auto's
        original = rows[list(decoders).index(copied)]
        rows[-1].update(copy_of=row_name(original), vs_original=ratio(rows[-1], original))
    auto = next(r for r in rows if r["mode"] == "auto")
    ran = decoders["auto"].last if kind == "both" else decoders["auto"]
    auto.update(kind=kind, k=ran.k, budget=ran.budget, run_as=run_as(ran),
                vs_choices=against(auto, rows, CHOICES[kind]), vs_best=against(auto, rows, ("plain", "fixed", "tree")))  # fmt: skip
    if kind == "both":
        auto.update(chosen=decoders["auto"].chosen, predicted=decoders["auto"].predicted(batch))
    return rows


def side_by_side_decoder(device, batch: int, compile, mode: str, k: int, budget):
    """The decoder of a side-by-side configuration (a second one: its control)."""
    plain, spec = build_decoders(device, max(k, 1), batch, compile, budget=budget,
                                 tree=TREE if mode.startswith("tree") else None)  # fmt: skip
    return plain if mode == "plain" else spec


def chain_or_tree(device, batch: int, compile, measured) -> ChainOrTree:
    """ChainOrTree over a chain decoder under the StepCosts of `measured` and a tree
    decoder under its TreeCosts, on one target (the tree's)."""
    _, tree = build_decoders(device, TREE.depth, batch, compile, tree=TREE, budget=tree_costs_of(measured, "this run"))
    costs = costs_of(measured, "this run")
    _, chain = build_decoders(device, K, batch, compile, budget=costs)  # its proposer, on the tree's target
    return ChainOrTree(SpeculativeDecoder(tree.target, chain.full_proposer, compile=compile, budget=costs), tree)


def side_by_side(args, device, compile, name: str) -> int:
    kind = "both" if args.both else "trees" if args.trees else "chains"
    print(f"{name} (torch {torch.__version__}); demo pair, greedy, {args.max_new_tokens} new tokens per request; "
          f"each configuration compiled once in this process, {args.rounds} interleaved rounds, the median round\n")  # fmt: skip
    print(
        "| B | configuration | decode tokens/s | quartile spread | auto / it: medians, paired (quartiles) | lossless |"
    )
    print("|---|---|---|---|---|---|")
    ok = True
    for batch in args.batch_sizes:
        rows = side_by_side_batch(device, batch, compile, args.max_new_tokens, args.rounds, kind, args.control)
        ok &= all(r["lossless"] for r in rows)
        auto = next(r for r in rows if r["mode"] == "auto")
        for r in rows:
            what = f"**auto** (runs {auto['run_as']})" if r is auto else row_name(r)
            versus = ""
            if r["mode"] == "control":
                v, (low, high) = r["vs_original"], r["vs_original"]["paired_quartiles"]
                what = f"control (a second {r['copy_of']})"
                versus = f"it / the first: {v['medians']:.3f}, {v['paired']:.3f} ({low:.3f}-{high:.3f})"
            for label in ("vs_choices", "vs_best"):
                v = auto[label]
                if r is not auto and v["best"] == what.split(" (")[0]:
                    low, high = v["paired_quartiles"]
                    versus += f"{label}: {v['medians']:.3f}, {v['paired']:.3f} ({low:.3f}-{high:.3f}) "
            print(f"| {batch} | {what} | {r['decode_tokens_per_s']:,.0f} | {r['quartile_spread']:.0%} | "
                  f"{versus.strip()} | {'yes' if r['lossless'] else 'FAIL'} |", flush=True)  # fmt: skip
        if not args.smoke:
            for r in rows:
                config = {key: r[key] for key in ("B", "mode", "k", "budget")}
                config.update(max_new_tokens=args.max_new_tokens, rounds=args.rounds, kind=kind,
                              small_linear=linear.SMALL_LINEAR_FORM)  # fmt: skip
                metrics = {key: v for key, v in r.items() if key not in config}
                append_rows("budget_side_by_side", [(config, metrics)], device=name)
    return 0 if ok else 1


def write_costs(device_name: str | None) -> int:
    """The package's demo pair tables from the newest `budget` rows of one device
    measured with this process's few-row linear form (SPECDRAFT_SMALL_LINEAR; rows
    from before the column, blas)."""
    form = linear.SMALL_LINEAR_FORM
    rows = [r for r in latest(read_rows("budget", RESULTS))
            if r["config"]["mode"] != "auto" and r["config"].get("small_linear", "blas") == form]  # fmt: skip
    print(f"rows measured with few-row fp32 linears as {form} (SPECDRAFT_SMALL_LINEAR)")
    device_name = device_name or rows[-1]["device"]
    flat = [{**r["config"], **r["metrics"]} for r in rows if r["device"] == device_name]
    costs = costs_of(flat, device_name)
    COSTS_FILE.write_text(costs.to_json())
    count = sum(len(v) for v in costs.seconds.values())
    print(f"{count} iteration times at B = {sorted(costs.seconds)} -> {COSTS_FILE}")
    trees = tree_costs_of(flat, device_name)
    TREE_COSTS_FILE.write_text(trees.to_json())
    count = sum(len(v) for v in trees.rows.values())
    print(f"{count} tree iterations ({TREE}) at B = {sorted(trees.rows)} -> {TREE_COSTS_FILE}")
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
    parser.add_argument("--side-by-side", action="store_true", help="plain, fixed K, a budget and auto in one "
                        "process, interleaved rounds (table budget_side_by_side)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=21, help="--side-by-side: interleaved rounds (the median)")
    parser.add_argument("--trees", action="store_true", help="--side-by-side: the tree's configurations and a "
                        "TreeCosts auto (with plain and fixed K = 3) instead of the chains'")  # fmt: skip
    parser.add_argument("--both", action="store_true", help="--side-by-side: the chains' and the tree's "
                        "configurations, and a ChainOrTree auto over both tables")  # fmt: skip
    parser.add_argument("--control", action="store_true", help="--side-by-side: a second copy of the fastest "
                        "configuration in the timed rounds, to show how far two copies of one iteration read apart")  # fmt: skip
    args = parser.parse_args(argv)
    if args.write_costs:
        return write_costs(args.device_name)
    device = torch.device(args.device)
    compile = False if args.smoke else compile_options(args.device, True)
    batch_sizes = [1, 4] if args.smoke else args.batch_sizes
    max_new = 8 if args.smoke else args.max_new_tokens
    repeats = 1 if args.smoke else args.repeats
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    if args.side_by_side:
        # Every configuration's iteration stays compiled at once: more graphs of one code
        # object than Dynamo's default limit (8).
        torch._dynamo.config.recompile_limit = 64
        if args.smoke:
            args.batch_sizes, args.max_new_tokens, args.rounds = batch_sizes, max_new, 3
        return side_by_side(args, device, compile, name)
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
                config.update(max_new_tokens=max_new, repeats=repeats, small_linear=linear.SMALL_LINEAR_FORM)
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
