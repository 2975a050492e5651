"""Choosing a batch's verify budget from measured iteration costs.

A compiled iteration has static shapes, so its time is a property of the device, the
model pair, the batch size B and the budget alone: `StepCosts` holds those times,
measured once by `benchmarks/bench_budget.py --write-costs` (a table per device and
pair, JSON). What the budget buys depends on the prompts: the expected accepted
drafts, from per-position acceptance rates (the table's own, measured at fixed K, then
the decoder's running estimate). `choose_budget` keeps the budget with the most
expected tokens per second, or plain decoding (no drafting at all) where that wins.

Expected tokens of an iteration at budget b, all B requests alike with conditional
acceptance rates a_0 .. a_{K-1} (draft j accepted given drafts 0 .. j - 1 were): the
budget goes to position 0 of every request first (the highest expected gain
a_0), then position 1 (a_0 a_1), and so on, so

    tokens(b) = B + sum_j min(B, max(0, b - j B)) * a_0 * ... * a_j

and the chosen budget maximises tokens(b) / seconds(B, b) over the measured budgets.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Sequence
from importlib import resources

PLAIN = 0  # the budget key of plain decoding (no drafts, no draft pass)


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """Seconds per compiled iteration, measured on one device for one pair.

    seconds: {B: {budget: seconds}}, where budget PLAIN (0) is plain decoding's
    iteration (the target alone) and budget b >= 1 the budgeted iteration verifying at
    most b drafts; k: the proposer's drafts per request when measured (budget B * k is
    fixed K); rates: conditional per-position acceptance rates measured with the
    costs (the prior of `choose_budget`); device, pair: what was measured, for the
    reader (a table is only valid where it was measured)."""

    seconds: dict[int, dict[int, float]]
    k: int
    rates: tuple[float, ...]
    device: str = ""
    pair: str = ""

    def __post_init__(self) -> None:
        if not self.seconds:
            raise ValueError("seconds: no measured batch size")
        for batch, row in self.seconds.items():
            if not isinstance(batch, int) or batch < 1:
                raise ValueError(f"seconds: batch sizes are ints >= 1, got {batch!r}")
            if PLAIN not in row:
                raise ValueError(f"seconds[{batch}]: needs plain decoding's time (budget {PLAIN})")
            for budget, value in row.items():
                if not isinstance(budget, int) or not 0 <= budget <= batch * self.k:
                    raise ValueError(
                        f"seconds[{batch}]: budgets are ints in [0, B * k = {batch * self.k}], got {budget!r}"
                    )
                if not (isinstance(value, float | int) and math.isfinite(value) and value > 0):
                    raise ValueError(f"seconds[{batch}][{budget}]: a time > 0, got {value!r}")
        if len(self.rates) != self.k or not all(0.0 <= r <= 1.0 for r in self.rates):
            raise ValueError(f"rates: {self.k} conditional acceptance rates in [0, 1], got {self.rates!r}")

    def to_json(self) -> str:
        seconds = {str(b): {str(k): v for k, v in sorted(row.items())} for b, row in sorted(self.seconds.items())}
        body = {"device": self.device, "pair": self.pair, "k": self.k, "rates": list(self.rates), "seconds": seconds}
        return json.dumps(body, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> StepCosts:
        body = json.loads(text)
        seconds = {int(b): {int(k): float(v) for k, v in row.items()} for b, row in body["seconds"].items()}
        return cls(seconds, int(body["k"]), tuple(float(r) for r in body["rates"]), body.get("device", ""),
                   body.get("pair", ""))  # fmt: skip

    def save(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | pathlib.Path) -> StepCosts:
        return cls.from_json(pathlib.Path(path).read_text())

    def nearest_batch(self, num_reqs: int) -> int:
        """The smallest measured B >= num_reqs (the largest beyond the table)."""
        larger = [b for b in self.seconds if b >= num_reqs]
        return min(larger) if larger else max(self.seconds)


def expected_tokens(budget: int, num_reqs: int, rates: Sequence[float]) -> float:
    """Tokens an iteration emits in expectation at `budget` (module doc)."""
    total, gain = float(num_reqs), 1.0
    for j, rate in enumerate(rates):
        gain *= rate
        total += min(num_reqs, max(0, budget - j * num_reqs)) * gain
    return total


def choose_budget(num_reqs: int, costs: StepCosts, rates: Sequence[float] | None = None) -> int:
    """The budget for a batch of num_reqs requests: the measured budget (scaled from
    the nearest measured batch size to this one) with the most expected tokens per
    second; PLAIN (0) for plain decoding. rates: conditional per-position acceptance
    rates (default: the table's)."""
    if isinstance(num_reqs, bool) or not isinstance(num_reqs, int) or num_reqs < 1:
        raise ValueError(f"num_reqs: an int >= 1, got {num_reqs!r}")
    rates = costs.rates if rates is None else tuple(rates)
    if len(rates) != costs.k:
        raise ValueError(f"rates: {costs.k} rates (the table's k), got {len(rates)}")
    measured = costs.nearest_batch(num_reqs)
    best, best_rate = PLAIN, -1.0
    for budget, seconds in sorted(costs.seconds[measured].items()):
        scaled = round(budget * num_reqs / measured)
        if budget != PLAIN and scaled == PLAIN:
            continue  # a budget that rounds to nothing is not plain decoding's time
        tokens = num_reqs if budget == PLAIN else expected_tokens(scaled, num_reqs, rates)
        rate = tokens / seconds
        if rate > best_rate:
            best, best_rate = scaled, rate
    return best


def conditional_rates(accepted_per_position, tested_per_position) -> tuple[float, ...] | None:
    """Per-position conditional acceptance rates from a run's statistics
    (GenerationStats.accepted_per_position / tested_per_position); None where a
    position was never tested."""
    rates = []
    for accepted, tested in zip(accepted_per_position, tested_per_position, strict=True):
        if tested <= 0:
            return None
        rates.append(min(1.0, max(0.0, float(accepted) / float(tested))))
    return tuple(rates)


def demo_pair_costs(name: str = "demo_pair_step_costs.json") -> StepCosts:
    """The shipped demo pair's table (measured on the GPU named inside)."""
    return StepCosts.from_json(resources.files(__package__).joinpath(name).read_text())
