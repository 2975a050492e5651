"""Which budget a run takes when the decoder's budget is a StepCosts table: the
choice per batch size (kept unless another is expected SWITCH_MARGIN faster), the
proposer drafting that many tokens, and the acceptance rates the next run's choice
reads. A mixin of SpeculativeDecoder (its full_proposer, budget_policy,
acceptance_rates, run_choices and fewer_drafts)."""

from .stats import GenerationStats
from .step_costs import PLAIN, Choice, conditional_rates, predicted_rates

SWITCH_MARGIN = 0.05  # a budget table's choice changes when another is expected this much faster


def without_draft_confidence(proposer):
    """Proposer (head and KV caches shared) with a config that does not ask for the
    draft's confidence (a DSpark confidence head still computes its own)."""
    return proposer.with_config(return_draft_confidence=False)


def kept_or_faster(speeds: dict, picks: dict, num_reqs: int):
    """The key of `speeds` (expected tokens per second) a run of num_reqs requests
    takes: picks[num_reqs], the previous pick at this batch size, unless the fastest
    (the first on a tie) is expected SWITCH_MARGIN faster; picks keeps the result."""
    best = max(speeds, key=speeds.__getitem__)
    current = picks.get(num_reqs)
    if current in speeds and speeds[best] <= speeds[current] * (1 + SWITCH_MARGIN):
        return current
    picks[num_reqs] = best
    return best


class RunBudget:
    @property
    def draft_depths(self) -> range:
        """The draft depths a budget table may choose: 1 .. the proposer's K, or K
        alone when it cannot draft fewer (Proposer.drafts_fewer)."""
        k = self.full_proposer.num_speculative_tokens
        return range(1 if getattr(self.full_proposer, "drafts_fewer", False) else k, k + 1)

    def choose_for_run(self, num_reqs: int) -> Choice:
        """The table's choice for a run of num_reqs requests with the current acceptance
        estimate; the batch size's previous choice is kept unless the new one is
        expected to be SWITCH_MARGIN faster (each choice is a graph of its own: a
        change costs a compile, and a noisy estimate should not flip between two near
        equals)."""
        speeds = predicted_rates(num_reqs, self.budget_policy, self.acceptance_rates, self.draft_depths)
        return kept_or_faster(speeds, self.run_choices, num_reqs)

    def take_choice(self, choice: Choice, num_reqs: int) -> None:
        """A budget table's choice for the next run of num_reqs requests, run as the
        cheapest iteration that does it: PLAIN as plain decoding (no proposer for the
        run: no draft prefill, no draft pass); a budget of every draft (B * k or more)
        as the fixed-k iteration, which it equals token for token, without the
        allocation and the packing, and without the draft's confidence (with
        calibration on, the budgeted one, which keeps the running rates); otherwise k
        drafts per request under the budget. The proposer drafting k is kept per (k,
        fixed or budgeted), so that a compiled iteration sees the same object again."""
        if choice == PLAIN:
            self.proposer, self.k, self.budget = None, 0, None
            return
        every_draft = choice.budget >= num_reqs * choice.k and self.calibration is None
        key = (choice.k, every_draft)
        if key not in self.fewer_drafts:
            self.fewer_drafts[key] = self.full_proposer.with_num_drafts(choice.k)
            if every_draft:  # the fixed-k iteration ranks nothing: no draft confidence
                self.fewer_drafts[key] = without_draft_confidence(self.fewer_drafts[key])
        self.proposer, self.k = self.fewer_drafts[key], choice.k
        self.budget = None if every_draft else choice.budget

    def learn_rates(self, stats: GenerationStats) -> None:
        """The next run's acceptance estimate: this run's conditional rates per position
        it drafted; deeper positions keep their estimate."""
        rates = conditional_rates(stats.accepted_per_position, stats.tested_per_position)
        if rates is not None:
            self.acceptance_rates = rates + tuple(self.acceptance_rates[len(rates) :])
