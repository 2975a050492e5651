"""Show evaluation results: the per-step table as text, and PNG plots (acceptance per
step; acceptance length over training). Plotting needs matplotlib, an optional
extra: pip install "matplotlib>=3.7" (what the plot extra needs), or
pip install ".[plot]" in a clone of the project's source repository."""

from __future__ import annotations

from pathlib import Path

from specdraft.training.budget_curve import BudgetCurve, BudgetPoint, at_budget, budget_curve
from specdraft.training.metrics import DraftMetrics, DraftMetricSums

PLOT_EXTRA = 'plotting needs matplotlib: pip install "matplotlib>=3.7" (or, in a clone, pip install ".[plot]")'


def sampling_label(temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> str:
    """A sampling setting in words: the temperature, then the truncation parameters
    that are on ("temperature 0.7, top-k 20, top-p 0.9")."""
    parts = [f"temperature {temperature:g}"]
    parts += [f"top-k {top_k}"] if top_k > 0 else []
    parts += [f"top-p {top_p:g}"] if top_p < 1 else []
    parts += [f"min-p {min_p:g}"] if min_p > 0 else []
    return ", ".join(parts)


def format_table(metrics: DraftMetrics, sums: DraftMetricSums, temperature: float = 0.0, *, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0) -> str:  # fmt: skip
    """The per-step table and the acceptance lengths, as printed by `python -m
    specdraft.eval`. Step k is the k-th draft of a chain (k = 1 .. K). top_k, top_p,
    min_p: the truncation the sums were taken with (named in the expected line)."""
    divergence = metrics.cross_entropy.numel() > 0
    header = f"{'step':>4}  {'scored':>9}  {'greedy acc':>10}  {'all k match':>11}  {'Σ min(p,q)':>10}"
    header += f"  {'CE':>7}  {'KL':>7}" if divergence else ""
    lines = [header, "-" * len(header)]
    for k in range(metrics.accuracy.shape[0]):
        row = (
            f"{k + 1:>4}  {int(sums.count[k]):>9}  {float(metrics.accuracy[k]):>10.4f}  "
            f"{float(metrics.accepted_prefix_rate[k]):>11.4f}  {float(metrics.acceptance_rate[k]):>10.4f}"
        )
        if divergence:
            row += f"  {float(metrics.cross_entropy[k]):>7.4f}  {float(metrics.kl[k]):>7.4f}"
        lines.append(row)
    greedy_label = "greedy acceptance length (exact, per start)"
    lines += [
        "",
        f"{greedy_label}: {float(metrics.acceptance_length):.4f} drafts per verification "
        f"(+1 bonus token = tokens per target pass), over {int(sums.starts)} starts",
        f"{'product of per-step accuracies (SpecForge)':<{len(greedy_label)}}: "
        f"{float(metrics.marginal_acceptance_length):.4f}",
    ]
    if temperature > 0:  # at temperature 0, Σ min(p, q) is the greedy match itself
        label = f"expected at {sampling_label(temperature, top_k, top_p, min_p)} (Σ min(p,q))"
        lines.append(f"{label:<{len(greedy_label)}}: {float(metrics.expected_acceptance_length):.4f}")
    return "\n".join(lines)


def budget_points(metrics: DraftMetrics, sums: DraftMetricSums, budget: float | None = None) -> list[BudgetPoint]:
    """Budgeted verification against fixed K (training.budget_curve) at 0.5, 1, 2, ..
    K drafts verified per start and at `budget`; the sums must hold the curve
    (DraftEvaluator(budget=True))."""
    if sums.budget_drafts.numel() == 0:
        raise ValueError("sums: no budget curve in them (evaluate with DraftEvaluator(budget=True))")
    num_steps = metrics.accuracy.shape[0]
    curve = curve_of(sums)
    expected_rates = sums.expected_prefix / sums.starts
    levels = sorted({0.5, *range(1, num_steps + 1), *([budget] if budget is not None else [])})
    return [at_budget(curve, float(v), metrics.accepted_prefix_rate, expected_rates) for v in levels]


def curve_of(sums: DraftMetricSums) -> BudgetCurve:
    """The budget curve of sums that hold one (DraftEvaluator(budget=True))."""
    return budget_curve(sums.budget_drafts, sums.budget_accepted, sums.budget_expected, sums.starts)


def format_budget(points: list[BudgetPoint], temperature: float = 0.0, budget: float | None = None,
                  ranked_by: str = "the draft's confidence") -> str:  # fmt: skip
    """The budget table printed by `python -m specdraft.eval --budget`: accepted drafts
    per start when the drafts of largest expected gain are verified first, against
    fixed K verifying as many; expected (Σ min(p, q)) columns when sampled."""
    sampled = temperature > 0
    header = f"{'verified':>8}  {'budgeted':>9}  {'fixed K':>9}"
    header += f"  {'budgeted E':>10}  {'fixed K E':>10}" if sampled else ""
    lines = [f"budgeted verification (drafts ranked by {ranked_by}, every start against every other; accepted "
             "drafts per start, greedy" + (", and E: expected at the temperature)" if sampled else ")"),
             header, "-" * len(header)]  # fmt: skip
    for point in points:
        row = f"{point.verified:>8.2f}  {point.accepted:>9.4f}  {point.fixed_accepted:>9.4f}"
        row += f"  {point.expected:>10.4f}  {point.fixed_expected:>10.4f}" if sampled else ""
        lines.append(row + ("  <- --budget" if budget is not None and point.verified == budget else ""))
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend; ModuleNotFoundError naming
    the extra when matplotlib is not installed."""
    try:
        import matplotlib
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(PLOT_EXTRA) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_acceptance(metrics: DraftMetrics, path: str | Path, title: str = "", temperature: float = 0.0, *,
                    top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                    sums: DraftMetricSums | None = None) -> Path:  # fmt: skip
    """PNG of the per-step rates: greedy accuracy, the share of starts whose first k
    drafts all match (what greedy verification accepts), and Σ min(p, q) at
    `temperature` and the truncation top_k / top_p / min_p (at temperature 0 it
    equals the greedy accuracy). With `sums` holding a budget curve
    (DraftEvaluator(budget=True)), a second panel: accepted drafts per start against
    drafts verified per start, budgeted and fixed K."""
    plt = pyplot()
    steps = list(range(1, metrics.accuracy.shape[0] + 1))
    series = {
        "greedy accuracy (draft k = target argmax)": metrics.accuracy,
        "drafts 1..k all accepted (greedy)": metrics.accepted_prefix_rate,
        f"Σ min(p, q) at {sampling_label(temperature, top_k, top_p, min_p)}": metrics.acceptance_rate,
    }
    with_budget = sums is not None and sums.budget_drafts.numel() > 0
    fig, axes = plt.subplots(1, 2 if with_budget else 1, figsize=(12.0 if with_budget else 6.4, 4.0), dpi=110)
    ax = axes[0] if with_budget else axes
    if with_budget:
        plot_budget_panel(axes[1], sums, temperature > 0)
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([s + (i - 1) * width for s in steps], [float(v) for v in values], width, label=label)
    ax.set_xticks(steps)
    ax.set_xlabel("draft step k")
    ax.set_ylabel("rate")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower left", fontsize=8)
    subtitle = (
        f"acceptance length {float(metrics.acceptance_length):.3f} "
        f"(product of marginals {float(metrics.marginal_acceptance_length):.3f})"
    )
    ax.set_title(f"{title}\n{subtitle}" if title else subtitle, fontsize=10)
    return save(fig, path)


def plot_budget_panel(ax, sums: DraftMetricSums, sampled: bool) -> None:
    """Accepted drafts per start against drafts verified per start: the budget curve
    (training.budget_curve) and fixed K = 1 .. K."""
    curve = curve_of(sums)
    fixed = [0.0, *(sums.accepted_prefix / sums.starts).cumsum(0).tolist()]
    ax.plot(curve.verified.tolist(), curve.accepted.tolist(), label="budgeted, greedy")
    ax.plot(range(len(fixed)), fixed, marker="o", linestyle="--", label="fixed K, greedy")
    if sampled:
        fixed_expected = [0.0, *(sums.expected_prefix / sums.starts).cumsum(0).tolist()]
        ax.plot(curve.verified.tolist(), curve.expected.tolist(), label="budgeted, expected (Σ min(p, q))")
        ax.plot(range(len(fixed_expected)), fixed_expected, marker="s", linestyle="--",
                label="fixed K, expected")  # fmt: skip
    ax.set_xlabel("drafts verified per start")
    ax.set_ylabel("drafts accepted per start")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("budgeted verification (all starts ranked together)", fontsize=10)


def plot_training_curve(steps: list[int], series: dict[str, list[float]], path: str | Path, title: str = "") -> Path:
    """PNG of metrics over training steps, one line per entry of `series`."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for label, values in series.items():
        ax.plot(steps, values, marker="o", markersize=3, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("accepted drafts per verification")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return save(fig, path)


def save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    fig.clf()
    return path
