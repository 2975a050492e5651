"""Choosing a draft tree's node budget per run from measured iterations.

A chain's StepCosts predicts an iteration's tokens from per-position acceptance
rates (step_costs.py). A tree's tokens depend on which nodes a budget keeps, so a
`TreeCosts` table holds, for one tree shape and pair, what each budget measured at
each batch size: seconds per iteration and tokens per request and iteration
(acceptance length). `choose` keeps the budget with the most tokens per second at
the smallest measured batch size >= the run's (as StepCosts reads its rows), its
budget scaled to the run's. Budgets: None, the whole tree (every node verified: the
unbudgeted tree iteration); 0, plain decoding (no draft pass); n > 0, the n best
nodes of the batch. `benchmarks/bench_budget.py
--write-costs` writes the demo pair's (`demo_pair_tree_costs`) beside its StepCosts.
"""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass, field
from importlib import resources

from .step_costs import measured_batch_for

WHOLE_TREE = None  # the budget that verifies every node
PLAIN = 0  # the budget that verifies none: plain decoding


def shape_tuple(shape) -> tuple:
    """(depth, topk, num_verify_tokens) of a TreeShape or of such a sequence."""
    if hasattr(shape, "num_verify_tokens"):
        return (shape.depth, shape.topk, shape.num_verify_tokens)
    return tuple(shape)


def _key(budget: int | None) -> str:
    return "tree" if budget is None else str(budget)


def _budget(key: str) -> int | None:
    return None if key == "tree" else int(key)


@dataclass(frozen=True)
class TreeCosts:
    """shape: the tree (depth, topk, num_verify_tokens; or a TreeShape) the rows were
    measured with.
    rows: {B: {budget: (seconds per iteration, tokens per request and iteration)}},
    budget None (the whole tree), 0 (plain decoding, in every row) or the nodes kept
    per iteration over the B requests. device, pair: what was measured."""

    shape: tuple[int, int, int]
    rows: dict[int, dict[int | None, tuple[float, float]]]
    device: str = ""
    pair: str = ""
    nodes_per_request: int = field(init=False)

    def __post_init__(self) -> None:
        shape = shape_tuple(self.shape)
        if len(shape) != 3 or not all(isinstance(v, int) and v >= 1 for v in shape):
            raise ValueError(f"shape: (depth, topk, num_verify_tokens), positive ints, got {self.shape!r}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "nodes_per_request", shape[2] - 1)
        if not self.rows:
            raise ValueError("rows: at least one batch size")
        for batch, row in self.rows.items():
            if not isinstance(batch, int) or batch < 1 or not row:
                raise ValueError(f"rows[{batch!r}]: a batch size >= 1 with at least one budget")
            if PLAIN not in row:
                # Every run can decode plainly, and a row whose node budgets all scale
                # to nothing at a smaller batch would leave a run no choice at all.
                raise ValueError(f"rows[{batch}]: needs plain decoding's entry (budget 0)")
            for budget, value in row.items():
                if budget is not None and not (
                    isinstance(budget, int) and 0 <= budget <= batch * self.nodes_per_request
                ):
                    raise ValueError(f"rows[{batch}]: a budget is None (the whole tree) or an int in [0, "
                                     f"{batch * self.nodes_per_request}], got {budget!r}")  # fmt: skip
                seconds, tokens = value
                if not (seconds > 0 and math.isfinite(seconds) and tokens >= 1 and math.isfinite(tokens)):
                    raise ValueError(f"rows[{batch}][{budget!r}]: seconds > 0 and tokens per request >= 1, "
                                     f"got {value!r}")  # fmt: skip

    def nearest_batch(self, num_reqs: int) -> int:
        """The smallest measured batch size >= num_reqs (the largest beyond the table)."""
        if isinstance(num_reqs, bool) or not isinstance(num_reqs, int) or num_reqs < 1:
            raise ValueError(f"num_reqs: an int >= 1, got {num_reqs!r}")
        return measured_batch_for(self.rows, num_reqs)

    def rates(self, num_reqs: int) -> dict[int | None, float]:
        """{budget for num_reqs requests: measured tokens per second per request} from
        nearest_batch's row, its budgets scaled to num_reqs (one that
        rounds to 0 from a budget above 0 is left out: it would be plain decoding)."""
        measured = self.nearest_batch(num_reqs)
        rates: dict[int | None, float] = {}
        for budget, (seconds, tokens) in self.rows[measured].items():
            scaled = budget if budget is None or budget == 0 else round(budget * num_reqs / measured)
            if budget is not None and budget > 0 and scaled == 0:
                continue
            if scaled is not None and scaled >= num_reqs * self.nodes_per_request:
                scaled = WHOLE_TREE  # every node: the whole tree's iteration
            rates[scaled] = max(rates.get(scaled, 0.0), tokens / seconds)
        return rates

    def choose(self, num_reqs: int) -> int | None:
        """The budget with the most measured tokens per second for num_reqs requests;
        on a tie the whole tree first, then plain decoding, then a node budget."""
        rates = self.rates(num_reqs)
        order = {WHOLE_TREE: 0, PLAIN: 1}
        return max(rates, key=lambda b: (rates[b], -order.get(b, 2)))

    def to_json(self) -> str:
        rows = {str(b): {_key(k): list(v) for k, v in row.items()} for b, row in sorted(self.rows.items())}
        return json.dumps({"device": self.device, "pair": self.pair, "shape": list(self.shape), "rows": rows},
                          indent=1)  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> TreeCosts:
        data = json.loads(text)
        rows = {int(b): {_budget(k): tuple(v) for k, v in row.items()} for b, row in data["rows"].items()}
        return cls(shape=tuple(data["shape"]), rows=rows, device=data.get("device", ""), pair=data.get("pair", ""))

    def save(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | pathlib.Path) -> TreeCosts:
        return cls.from_json(pathlib.Path(path).read_text())


def demo_pair_tree_costs(name: str = "demo_pair_tree_costs.json") -> TreeCosts:
    """The shipped demo pair's tree table (its shape in .shape)."""
    return TreeCosts.from_json(resources.files(__package__).joinpath(name).read_text())
