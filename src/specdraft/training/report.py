"""Show evaluation results: the per-step table as text, and PNG plots (acceptance per
step; acceptance length over training). Plotting needs matplotlib, an optional
extra: pip install "matplotlib>=3.7" (what the plot extra needs), or
pip install ".[plot]" in a clone of the project's source repository."""

from __future__ import annotations

from pathlib import Path

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
                    top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> Path:  # fmt: skip
    """PNG of the per-step rates: greedy accuracy, the share of starts whose first k
    drafts all match (what greedy verification accepts), and Σ min(p, q) at
    `temperature` and the truncation top_k / top_p / min_p (at temperature 0 it
    equals the greedy accuracy)."""
    plt = pyplot()
    steps = list(range(1, metrics.accuracy.shape[0] + 1))
    series = {
        "greedy accuracy (draft k = target argmax)": metrics.accuracy,
        "drafts 1..k all accepted (greedy)": metrics.accepted_prefix_rate,
        f"Σ min(p, q) at {sampling_label(temperature, top_k, top_p, min_p)}": metrics.acceptance_rate,
    }
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
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
