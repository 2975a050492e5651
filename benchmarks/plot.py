"""The plots drawn from the benchmark tables (benchmarks/results/<table>.jsonl), as PNGs
beside them. Needs matplotlib, the `plot` extra (pip install -e ".[plot]").

    python benchmarks/plot.py                  # every plot
    python benchmarks/plot.py tree_batch       # just these

Each plot uses each configuration's newest row (record.latest).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections import defaultdict

from record import RESULTS, latest, read_rows

PLOT_EXTRA = 'benchmarks/plot.py needs matplotlib: pip install -e ".[plot]" (or pip install matplotlib)'


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend; SystemExit naming the extra without it."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise SystemExit(PLOT_EXTRA) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def label(config: dict) -> str:
    if config["drafts"] == "chain":
        return f"chain, depth {config['depth']}"
    return f"tree ({config['depth']}, {config['topk']}, {config['N']})"


def tree_batch(plt, ax) -> str:
    """Speedup over plain decoding by batch size, the demo pair (the rows DEMO_PAIR_DRAFTS
    is chosen from: at each B those of the most timed calls)."""
    rows = [r for r in latest(read_rows("tree_batch")) if not r["config"]["profile"]]
    most = defaultdict(int)
    for r in rows:
        most[r["config"]["B"]] = max(most[r["config"]["B"]], r["config"]["repeats"])
    series = defaultdict(list)
    for r in rows:
        if r["config"]["repeats"] == most[r["config"]["B"]] and r["metrics"]["lossless"]:
            series[label(r["config"])].append((r["config"]["B"], r["metrics"]["speedup"]))
    for name, points in sorted(series.items()):
        ax.plot(*zip(*sorted(points), strict=True), marker="o", label=name)
    ax.axhline(1.0, color="gray", linewidth=1, linestyle="--", label="plain decoding")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("decode tokens/s over plain decoding")
    ax.set_title(f"Demo pair, greedy: drafts by batch size ({rows[0]['device']})")
    ax.legend()
    return "tree_batch"


def tree_acceptance(plt, ax) -> str:
    """Acceptance length (bonus included) by depth: the chain and trees of topk 4,
    greedy and at T = 0.7 (the demo pair, B = 1; the same on every device)."""
    newest = {}
    for r in read_rows("tree"):
        c = r["config"]
        newest[(c["drafts"], c["depth"], c["topk"], c["N"], c["temperature"])] = r["metrics"]["acceptance_length"]
    colors = {}
    for temperature, style in ((0.0, "-"), (0.7, ":")):
        series = defaultdict(list)
        for (drafts, depth, topk, n, t), length in newest.items():
            if t == temperature and (drafts == "chain" or topk == 4):
                series[0 if drafts == "chain" else n].append((depth, length))
        for n, points in sorted(series.items()):
            mode = "greedy" if temperature == 0 else f"T = {temperature}"
            name = "chain" if n == 0 else f"tree, topk 4, N = {n}"
            color = colors.setdefault(n, f"C{len(colors)}")
            ax.plot(*zip(*sorted(points), strict=True), style, color=color, marker="o", label=f"{name} ({mode})")
    ax.set_xticks(sorted({depth for (_, depth, *_) in newest}))
    ax.set_xlabel("depth D (draft steps)")
    ax.set_ylabel("acceptance length (tokens per target pass)")
    ax.set_title("Demo pair, B = 1: trees against the chain")
    ax.legend(fontsize="small")
    return "tree_acceptance"


def tree_8b_verify(plt, ax) -> str:
    """The 8B-shaped target's forward over N tree tokens, against one token."""
    rows = sorted(latest(read_rows("tree_8b_verify")), key=lambda r: r["config"]["N"])
    ns = [r["config"]["N"] for r in rows]
    ax.plot(ns, [r["metrics"]["target_fwd_us"] / 1e3 for r in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("tokens verified N (one request)")
    ax.set_ylabel("target forward, ms")
    ax.set_title(f"Llama-3-8B-shaped target, 32 layers, bf16 ({rows[0]['device']})")
    return "tree_8b_verify"


def sampling(plt, ax) -> str:
    """draft_sample and rejection_sample: share of copy bandwidth by batch size."""
    series = defaultdict(list)
    for r in latest(read_rows("sampling")):
        c = r["config"]
        series[(c["op"], c["V"])].append((c["B"], r["metrics"]["pct_of_copy"]))
    for (op, vocab), points in sorted(series.items()):
        ax.plot(*zip(*sorted(points), strict=True), marker="o", label=f"{op}, V = {vocab:,}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("% of device-to-device copy bandwidth")
    ax.set_title(f"Sampling ops, bf16 logits ({r['device']})")
    ax.legend()
    return "sampling"


PLOTS = {fn.__name__: fn for fn in (tree_batch, tree_acceptance, tree_8b_verify, sampling)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plots", nargs="*", metavar="PLOT", help=f"any of {', '.join(PLOTS)} (default: all)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS, help="folder of the PNGs (default: the tables')")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.plots) - set(PLOTS))
    if unknown:
        parser.error(f"no plot named {', '.join(unknown)}; the plots: {', '.join(PLOTS)}")
    plt = pyplot()
    for name in args.plots or PLOTS:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.grid(alpha=0.3)
        PLOTS[name](plt, ax)
        fig.tight_layout()
        path = args.out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
