"""Compare two `python -m specdraft.eval --json` records of the same shards (one
process, and torchrun over N ranks): the sums must be equal (counts exactly, float
sums within 1e-6 relative), and the table gives tokens/s with the scaling
efficiency (N-rank rate / (N x one-process rate)), overall and after each run's
first shard (which holds the compile).

    python scripts/compare_eval_runs.py one.json many.json
"""

import json
import math
import sys


def rates(timing):
    after = timing["after_first_tokens"] / timing["after_first_s"] if timing["after_first_s"] > 0 else math.nan
    return timing["tokens_per_s"], after


def main():
    one, many = (json.load(open(path)) for path in sys.argv[1:3])
    worst = 0.0
    for name, values in one["sums"].items():
        for a, b in zip(values if isinstance(values, list) else [values],
                        many["sums"][name] if isinstance(values, list) else [many["sums"][name]], strict=True):  # fmt: skip
            worst = max(worst, abs(a - b) / max(abs(a), 1e-30))
    ranks = many["timing"].get("ranks", 1)
    (total1, after1), (total_n, after_n) = rates(one["timing"]), rates(many["timing"])
    print(f"sums equal: {one['sums'] == many['sums']} (largest relative difference {worst:.1e}); "
          f"acceptance length {one['acceptance_length']:.6f} vs {many['acceptance_length']:.6f}")  # fmt: skip
    print()
    print("| run | tokens | wall s | first shard s (compile) | tokens/s | tokens/s after the first shard |")
    print("|---|---|---|---|---|---|")
    for label, record, total, after in (("1 GPU", one, total1, after1), (f"{ranks} GPUs (torchrun)", many, total_n, after_n)):  # fmt: skip
        t = record["timing"]
        print(
            f"| {label} | {t['tokens']} | {t['seconds']:.2f} | {t['first_batch_s']:.2f} | {total:.0f} | {after:.0f} |"
        )
    print(f"| scaling efficiency | | | | {total_n / (ranks * total1):.2f} | {after_n / (ranks * after1):.2f} |")
    return 0 if worst <= 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
