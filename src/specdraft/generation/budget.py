"""Budgeted verification: each iteration verifies the drafted positions that pay off
best over the whole batch, up to a budget, instead of K per request.

- **Survival estimate** of draft j of request r, s[r, j]: DSpark's confidence head
  (sigmoid of its logit), otherwise the draft's confidence at position j, the largest
  probability of its distribution there (SpeculativeConfig.return_draft_confidence;
  its probability of its own token when it drafts greedily). The expected gain of
  verifying position j is the product s[r, 0] * ... * s[r, j]: the chance every draft
  up to j is accepted.
- **Calibration** (optional, the decoder's `calibration`): each position's estimates
  scaled by a running ratio, kept on the device, of the drafts accepted there to
  their estimates (an EMA over the passes; no host read), so a head that is over- or
  under-confident at a position is corrected there. It reads only past passes, so the
  allocation still never reads the tokens it decides on.
- **Allocation**: the `budget` best positions of the batch by that gain (ops.budget_keep:
  ties go to the lower position, so a kept draft always has its predecessors kept). A
  request keeps a prefix of its drafts, possibly none (it decodes plainly that
  iteration); a finished request keeps none.
- **The verify pass** packs what was kept: request r sends its last token and its
  kept drafts, n_r = 1 + kept_r rows, one after the other, into a batch of B + budget
  rows (a Python int: one compiled graph per batch size and budget); the rows past the
  last request are padding (no KV write, no request). The rejection sampler verifies
  kept_r drafts of request r, and the draft pass reads the same packed windows.

Verifying a prefix of a draft is lossless, so greedy output stays the target's own and
sampled output keeps the target's distribution whatever the budget, provided the
decision to verify draft j does not depend on the token drawn at j: s[r, j] is a
function of the context before it (the draft's distribution at j, DSpark's head
reading the hidden state and the token before j), and draft j's rank never depends on
the positions after it (they rank below it). A rule reading the drawn token itself
(its own probability under a sampled draft) is not lossless: verifying a drawn
token only when it is likely over-represents likely tokens among those accepted
(tests/generation/test_budget.py measured it: a chi-square p-value of 0 at half the
drafts). A budget of at
least B * K keeps every draft of every running request: today's fixed-K iteration,
token for token.
"""

from typing import NamedTuple

import torch

from specdraft.layout import PADDING_SLOT_ID, BatchMetadata, window_of
from specdraft.ops import budget_keep

from .state import tested_and_accepted
from .step_costs import StepCosts
from .verify import slots_of


class PackedWindows(NamedTuple):
    """A verify pass over kept drafts, packed (see the module doc).

    token_ids [T] int32 and positions [T] int64 (padding rows: token 0, position 0);
    metadata: BatchMetadata of the packed windows (query_start_loc [B + 1]: the last
    entry is the used rows, not T; padding rows write to PADDING_SLOT_ID);
    rows [B, K + 1] int64: the packed row of (request, window offset), clamped into
    [0, T) past a request's window (those rows are never read);
    num_drafts [B] int32: the drafts each request verifies."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    metadata: BatchMetadata
    rows: torch.Tensor
    num_drafts: torch.Tensor


def survival_from(out) -> torch.Tensor | None:
    """[B, K] fp32 survival estimates of a proposer's output: DSpark's confidence
    logits through a sigmoid where the head has them, else the drafted tokens'
    probabilities (None when the proposer returned neither)."""
    confidence = getattr(out, "confidence_logits", None)
    if confidence is not None:
        return torch.sigmoid(confidence.float())
    draft_confidence = getattr(out, "draft_confidence", None)
    return None if draft_confidence is None else draft_confidence.float()


def expected_gains(survival: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """[B, K] fp32: the probability that drafts 0 .. j of request r are all accepted
    (cumulative product of the survival estimates, each clamped to [0, 1], NaN read as
    0), or -1 (never verified) for a finished request."""
    return torch.where(done[:, None], -1.0, survival_rates(survival).cumprod(dim=1))


def survival_rates(survival: torch.Tensor) -> torch.Tensor:
    """[B, K] fp32 survival estimates as probabilities: NaN read as 0, clamped to [0, 1]."""
    return torch.nan_to_num(survival.float(), nan=0.0).clamp(0.0, 1.0)


def calibrated(survival: torch.Tensor, calibration: torch.Tensor | None) -> torch.Tensor:
    """survival [B, K] scaled at each position j by the running ratio of the drafts
    accepted there to their estimates: calibration [2, K] = (EMA of the drafts
    accepted at j a pass, EMA of the estimates of the drafts tested at j a pass),
    each with one pseudo-draft added, so the factor is 1 before any pass and a head
    that is over- or under-confident at a position is corrected there
    (expected_gains clamps the product to [0, 1]). None: the estimates as they are."""
    if calibration is None:
        return survival
    return survival * ((calibration[0] + 1.0) / (calibration[1] + 1.0))


def updated_calibration(calibration: torch.Tensor, survival: torch.Tensor, counts: torch.Tensor,
                        num_drafts: torch.Tensor, done: torch.Tensor, weight: float) -> torch.Tensor:  # fmt: skip
    """The calibration after a pass (weight: the newest pass's share of the EMA). Draft
    j of request r was tested if r was running, verified it, and accepted every draft
    before it (counts [B]: drafts accepted); it was accepted if counts > j. The
    estimates are the uncalibrated ones (survival [B, K]), read as expected_gains
    reads them (survival_rates)."""
    tested, accepted = tested_and_accepted(done, counts, survival.shape[1], num_drafts)
    now = torch.stack([accepted.sum(dim=0).float(), torch.where(tested, survival_rates(survival), 0.0).sum(dim=0)])
    return calibration * (1.0 - weight) + now * weight


def kept_drafts(survival: torch.Tensor, done: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """[B] int32: how many drafts each request verifies this iteration."""
    gains = expected_gains(survival, done)
    depths = torch.arange(gains.shape[1], dtype=torch.int32, device=gains.device).expand_as(gains)
    return budget_keep(gains, depths.contiguous(), budget).counts


class PackedRows(NamedTuple):
    """Windows of window_lens [B] rows, packed one request after the other into a
    pass of num_rows rows: for each row, its request (clamped into [0, B)), its offset
    in the request's window (clamped into [0, width)) and whether it is a real row
    (rows past the last window are padding); starts / ends [B] int64, each window's
    first row and the row after its last."""

    request: torch.Tensor
    offset: torch.Tensor
    real: torch.Tensor
    starts: torch.Tensor
    ends: torch.Tensor


def packed_rows(window_lens: torch.Tensor, num_rows: int, width: int) -> PackedRows:
    """The packing of windows of window_lens [B] (<= width) rows into num_rows rows."""
    num_reqs = window_lens.shape[0]
    ends = window_lens.long().cumsum(0)
    starts = ends - window_lens.long()
    row = torch.arange(num_rows, device=window_lens.device)
    owner = window_of(row, ends)  # B for padding rows
    request = owner.clamp(max=num_reqs - 1)
    offset = (row - starts.index_select(0, request)).clamp(0, width - 1)
    return PackedRows(request, offset, owner < num_reqs, starts, ends)


def packed_layout(rows: PackedRows, lens: torch.Tensor, block_table, block_size: int):
    """(query_start_loc [B + 1] int32, slot_mapping [T] int64) of a packed pass: row i of
    a request's window at sequence index lens + i, padding rows writing no KV."""
    query_start_loc = torch.cat([rows.ends.new_zeros(1), rows.ends]).to(torch.int32)
    slots = slots_of(lens.index_select(0, rows.request) + rows.offset, rows.request, block_table, block_size)
    return query_start_loc, torch.where(rows.real, slots, PADDING_SLOT_ID)


def window_rows(rows: PackedRows, width: int, num_rows: int) -> torch.Tensor:
    """[B, width] int64: the packed row of (request, window offset), clamped into
    [0, num_rows) past a request's window (those rows are never read)."""
    offsets = torch.arange(width, device=rows.starts.device)
    return (rows.starts[:, None] + offsets[None, :]).clamp(max=num_rows - 1)


def packed_windows(last_tokens, drafts, lens, num_drafts, num_rows: int, block_table, block_size: int,
                   max_seq_len: int) -> PackedWindows:  # fmt: skip
    """Request r's window [last token, drafts 0 .. num_drafts[r] - 1] at positions
    lens[r] .. lens[r] + num_drafts[r], packed one request after the other into
    num_rows rows (>= B + num_drafts.sum(); a Python int, the pass's static size)."""
    width = drafts.shape[1] + 1
    window_lens = num_drafts.long() + 1
    rows = packed_rows(window_lens, num_rows, width)
    grid = torch.cat([last_tokens[:, None], drafts], dim=1)  # [B, K + 1]
    token_ids = torch.where(rows.real, grid[rows.request, rows.offset], 0).to(torch.int32)
    positions = torch.where(rows.real, lens.index_select(0, rows.request) + rows.offset, 0)
    query_start_loc, slot_mapping = packed_layout(rows, lens, block_table, block_size)
    metadata = BatchMetadata(
        query_start_loc=query_start_loc,
        seq_lens=(lens + window_lens).to(torch.int32),
        block_table=block_table,
        slot_mapping=slot_mapping,
        max_query_len=width,
        max_seq_len=max_seq_len,
    )
    return PackedWindows(token_ids, positions, metadata, window_rows(rows, width, num_rows), num_drafts.to(torch.int32))


def check_calibration(calibration, budget):
    """The decoder's calibration argument: None (survival estimates as the proposer
    gives them) or the newest pass's weight in (0, 1] of the running acceptance rates
    that calibrate them (`calibrated`); only with a budget."""
    if calibration is None:
        return None
    if isinstance(calibration, bool) or not isinstance(calibration, (int, float)) or not 0.0 < calibration <= 1.0:
        raise ValueError(f"calibration: the newest pass's weight in (0, 1] or None, got {calibration!r}")
    if budget is None:
        raise ValueError("calibration: calibrates a budget's survival estimates; pass budget= as well")
    return float(calibration)


def check_budget(budget, proposer):
    """The decoder's budget argument: None (verify every draft: fixed K), an int >= 0
    (the most drafts verified per iteration over the batch) or a StepCosts table (the
    budget chosen per run by `step_costs.choose_budget`). Needs a proposer that
    returns survival estimates (TreeSpeculativeDecoder refuses a budget itself)."""
    if budget is None:
        return None
    if isinstance(budget, StepCosts):
        if proposer is not None and budget.max_k > proposer.num_speculative_tokens:
            raise ValueError(f"budget: the table drafts up to k = {budget.max_k}, the proposer "
                             f"{proposer.num_speculative_tokens}")  # fmt: skip
    elif isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(
            f"budget: an int >= 0 (drafts verified per iteration over the batch), a StepCosts table or None, "
            f"got {budget!r}"
        )
    if proposer is None:
        raise ValueError("budget: plain decoding (no proposer) has no drafts to budget")
    confidence = getattr(getattr(proposer, "model", None), "confidence_head", None) is not None
    if not (confidence or proposer.config.return_draft_confidence):
        raise ValueError(
            "budget: the proposer returns no survival estimates; build it with "
            "SpeculativeConfig(return_draft_confidence=True) (or a DSpark head with a confidence head)"
        )
    return budget
