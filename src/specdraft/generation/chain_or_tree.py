"""A chain or a tree per run, whichever its measured table says is faster.

A chain decoder under a StepCosts table (step_costs.py) chooses, per run, plain
decoding, fixed K or a budget of drafts; a tree decoder under a TreeCosts table
(tree_costs.py) chooses plain decoding, the whole tree or a node budget. Neither
can run the other's drafts, and which wins depends on the batch size: on the demo
pair (H200) the chain of K = 3 beats the tree 4,4,16 at B = 1 (by 47-58%) and from B
= 64, the tree beats the chain at B = 4 and 16. `ChainOrTree` holds one decoder of each and
runs each call of `generate` on the one whose table predicts more tokens per second
at that batch size (the chain's from its running acceptance estimate, the tree's
from its measured tokens), keeping a batch size's previous pick unless the other is
predicted SWITCH_MARGIN faster (a switch can cost a compile). Both then choose their
own budget as they do alone.

The two decoders may share the target's KV cache and the proposer (runs never
overlap): pass the same `target_kv_caches`, sized for the tree (it writes N - 1
positions past a request, a chain K), to both.
"""

from __future__ import annotations

from .decoder import GenerationResult, SpeculativeDecoder
from .run_budget import kept_or_faster
from .step_costs import StepCosts, predicted_rates
from .tree_costs import TreeCosts
from .tree_decoder import TreeSpeculativeDecoder

CHAIN, TREE = "chain", "tree"


def check_pair(chain, tree) -> None:
    if isinstance(chain, TreeSpeculativeDecoder) or not isinstance(chain, SpeculativeDecoder):
        raise ValueError(f"chain: a SpeculativeDecoder (not a tree decoder), got {type(chain).__name__}")
    if not isinstance(chain.budget_policy, StepCosts):
        raise ValueError("chain: a decoder built with budget=StepCosts (its table predicts the chain's speed), got "
                         f"budget={chain.budget_policy!r}")  # fmt: skip
    if not isinstance(tree, TreeSpeculativeDecoder):
        raise ValueError(f"tree: a TreeSpeculativeDecoder, got {type(tree).__name__}")
    if not isinstance(tree.budget_policy, TreeCosts):
        raise ValueError("tree: a decoder built with budget=TreeCosts (its table predicts the tree's speed), got "
                         f"budget={tree.budget_policy!r}")  # fmt: skip
    if tree.target is not chain.target:
        raise ValueError("tree: its target is not the chain's (both decode one target model)")


def predicted_speeds(num_reqs: int, step_costs: StepCosts, tree_costs: TreeCosts, rates=None,
                     draft_depths=None) -> dict[str, float]:  # fmt: skip
    """{"chain": the most tokens per second step_costs predicts for a batch of num_reqs
    requests over its choices (plain decoding included; rates and draft_depths as
    step_costs.predicted_rates takes them), "tree": the most tree_costs measured,
    per request x num_reqs}."""
    chain = predicted_rates(num_reqs, step_costs, rates, draft_depths)
    return {CHAIN: max(chain.values()), TREE: num_reqs * max(tree_costs.rates(num_reqs).values())}


class ChainOrTree:
    """chain: a SpeculativeDecoder with budget=StepCosts; tree: a
    TreeSpeculativeDecoder with budget=TreeCosts, of the same target. `generate`
    takes SpeculativeDecoder.generate's arguments; `chosen` says which decoder the
    last run used ("chain" or "tree") and `last` is that decoder."""

    def __init__(self, chain: SpeculativeDecoder, tree: TreeSpeculativeDecoder) -> None:
        check_pair(chain, tree)
        self.decoders = {CHAIN: chain, TREE: tree}
        self.choices: dict[int, str] = {}  # the pick per batch size, kept between runs
        self.chosen: str | None = None

    @property
    def last(self) -> SpeculativeDecoder | None:
        return None if self.chosen is None else self.decoders[self.chosen]

    def predicted(self, num_reqs: int) -> dict[str, float]:
        """{"chain", "tree": the best tokens per second its table predicts for a batch
        of num_reqs requests, over every choice it can make (plain decoding included)}."""
        chain, tree = self.decoders[CHAIN], self.decoders[TREE]
        return predicted_speeds(num_reqs, chain.budget_policy, tree.budget_policy, chain.acceptance_rates,
                                chain.draft_depths)  # fmt: skip

    def choose(self, num_reqs: int) -> str:
        """The decoder for a run of num_reqs requests: the faster prediction (the chain
        on a tie), or this batch size's previous pick unless the other is predicted
        SWITCH_MARGIN faster."""
        return kept_or_faster(self.predicted(num_reqs), self.choices, num_reqs)  # the chain first: its key on a tie

    def generate(self, prompts, **kwargs) -> GenerationResult:
        self.chosen = self.choose(len(prompts))
        return self.decoders[self.chosen].generate(prompts, **kwargs)
