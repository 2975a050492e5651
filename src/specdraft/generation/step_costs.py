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

A choice is also how many tokens to draft (k <= the proposer's K: drafting costs
time whether or not the drafts are verified), so the table holds measured times per
(k, budget), and the chosen one maximises tokens / seconds over them and plain
decoding.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Collection, Sequence
from importlib import resources
from typing import NamedTuple


class Choice(NamedTuple):
    """What an iteration runs: k draft steps per request and a budget of drafts
    verified over the batch; PLAIN (0, 0) is plain decoding (no draft pass)."""

    k: int
    budget: int


PLAIN = Choice(0, 0)


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """Seconds per compiled iteration, measured on one device for one pair.

    seconds: {B: {Choice(k, budget): seconds}}: PLAIN is plain decoding's iteration
    (the target alone); (k, b) the budgeted iteration drafting k tokens per request
    and verifying at most b of them (b = B * k: every draft, fixed K). rates:
    conditional per-position acceptance rates measured with the costs (the prior of
    `choose_budget`), one per draft position of the deepest k. device, pair: what was
    measured, for the reader (a table is only valid where it was measured)."""

    seconds: dict[int, dict[Choice, float]]
    rates: tuple[float, ...]
    device: str = ""
    pair: str = ""

    def __post_init__(self) -> None:
        if not self.seconds:
            raise ValueError("seconds: no measured batch size")
        for batch, row in self.seconds.items():
            if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
                raise ValueError(f"seconds: batch sizes are ints >= 1, got {batch!r}")
            if PLAIN not in row:
                raise ValueError(f"seconds[{batch}]: needs plain decoding's time (PLAIN)")
            for (k, budget), value in row.items():
                if (k, budget) != PLAIN and not (1 <= k <= len(self.rates) and 0 <= budget <= batch * k):
                    raise ValueError(f"seconds[{batch}]: a choice (k, budget) needs 1 <= k <= {len(self.rates)} "
                                     f"(the rates) and 0 <= budget <= B * k, got {(k, budget)!r}")  # fmt: skip
                if not (isinstance(value, float | int) and math.isfinite(value) and value > 0):
                    raise ValueError(f"seconds[{batch}][{(k, budget)}]: a time > 0, got {value!r}")
        if not self.rates or not all(0.0 <= r <= 1.0 for r in self.rates):
            raise ValueError(f"rates: conditional acceptance rates in [0, 1], one per position, got {self.rates!r}")

    @property
    def max_k(self) -> int:
        return len(self.rates)

    def to_json(self) -> str:
        seconds = {str(b): {f"{k},{budget}": v for (k, budget), v in sorted(row.items())}
                   for b, row in sorted(self.seconds.items())}  # fmt: skip
        body = {"device": self.device, "pair": self.pair, "rates": list(self.rates), "seconds": seconds}
        return json.dumps(body, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> StepCosts:
        body = json.loads(text)
        seconds = {
            int(b): {Choice(*map(int, key.split(","))): float(v) for key, v in row.items()}
            for b, row in body["seconds"].items()
        }
        return cls(seconds, tuple(float(r) for r in body["rates"]), body.get("device", ""), body.get("pair", ""))

    def save(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | pathlib.Path) -> StepCosts:
        return cls.from_json(pathlib.Path(path).read_text())

    def nearest_batch(self, num_reqs: int) -> int:
        return measured_batch_for(self.seconds, num_reqs)


def measured_batch_for(batches, num_reqs: int) -> int:
    """The row of a table measured by batch size that a run of num_reqs requests
    reads: the smallest measured B >= num_reqs (the largest beyond the table), as
    StepCosts, TreeCosts and draft_choice.default_drafts all do."""
    larger = [b for b in batches if b >= num_reqs]
    return min(larger) if larger else max(batches)


def expected_tokens(budget: int, num_reqs: int, rates: Sequence[float]) -> float:
    """Tokens an iteration emits in expectation at `budget`, drafting len(rates)
    tokens per request (module doc)."""
    total, gain = float(num_reqs), 1.0
    for j, rate in enumerate(rates):
        gain *= rate
        total += min(num_reqs, max(0, budget - j * num_reqs)) * gain
    return total


def predicted_rates(num_reqs: int, costs: StepCosts, rates: Sequence[float] | None = None,
                    draft_depths: Collection[int] | None = None) -> dict[Choice, float]:  # fmt: skip
    """Expected tokens per second of every measured choice for a batch of num_reqs
    requests (its budget scaled from the nearest measured batch size to this one).
    rates: conditional per-position acceptance rates (default: the table's);
    draft_depths: the k the proposer can draft (default any; choices of other k are
    left out)."""
    if isinstance(num_reqs, bool) or not isinstance(num_reqs, int) or num_reqs < 1:
        raise ValueError(f"num_reqs: an int >= 1, got {num_reqs!r}")
    rates = costs.rates if rates is None else tuple(rates)
    measured = costs.nearest_batch(num_reqs)
    speeds = {}
    for choice, seconds in sorted(costs.seconds[measured].items()):
        if choice != PLAIN and draft_depths is not None and choice.k not in draft_depths:
            continue
        if choice.k > len(rates):
            raise ValueError(f"rates: {len(rates)} rates, the table drafts up to k = {choice.k}")
        budget = round(choice.budget * num_reqs / measured)
        if choice != PLAIN and budget == 0:
            continue  # a budget that rounds to nothing is not plain decoding's time
        tokens = num_reqs if choice == PLAIN else expected_tokens(budget, num_reqs, rates[: choice.k])
        speeds[PLAIN if choice == PLAIN else Choice(choice.k, budget)] = tokens / seconds
    return speeds


def choose_budget(num_reqs: int, costs: StepCosts, rates: Sequence[float] | None = None,
                  draft_depths: Collection[int] | None = None) -> Choice:  # fmt: skip
    """What a batch of num_reqs requests runs: the choice of `predicted_rates` with
    the most expected tokens per second (PLAIN: plain decoding); the first measured
    one on a tie."""
    speeds = predicted_rates(num_reqs, costs, rates, draft_depths)
    return max(speeds, key=speeds.__getitem__)


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
