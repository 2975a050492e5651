"""Training-time draft metrics as float64 sums: per step k of a K-step unroll, over
packed sequences, with no host sync (the whole computation compiles with
fullgraph=True, and with dynamic=True one graph serves every sequence length).

Alignment. draft_logits[k, t] is the k-th draft step (k = 0..K-1) from start
position t: in serving terms, the (k+1)-th token drafted for a request whose window
ends at t, whose next token x[t+1] is known. It predicts token t+k+2, so its target
is target_logits[t+k+1], the target model's own output at position t+k+1 (logits as
the target computes them, unshifted; the row at position j predicts token j+1).

Scored pairs. (k, t) is scored when row t+k+1 lies in t's sequence (cu_seqlens)
and loss_mask[t+k+1] is set. loss_mask marks target rows, not tokens: from a mask
over label tokens (token j to be learnt), pass label_mask shifted by one
(loss_mask[j] = label_mask[j+1]). A full start is a start t whose K pairs are all
scored; starts near a sequence's end or next to masked rows are not full.

Sums, per step k, each over the scored pairs of step k unless said otherwise:
- count: the number of scored pairs;
- matches: greedy matches, the target id of the draft's argmax (through d2t)
  equal to the target's argmax (ties: the lowest id, as torch.argmax);
- accept: the expected acceptance sum_x min(p(x), q(x)) at the temperature
  (ops.vocab_metrics: p, q the tempered target and draft distributions; target
  mass outside the draft vocabulary never accepts; greedy: the match). With a
  request's top-k / top-p / min-p (see Truncation) p and q are both truncated;
- accepted_prefix: over full starts, the number whose drafts 0..k all match;
  summed over k this is the exact per-start acceptance length (the number of
  leading drafts accepted by greedy verification along the data), a mean of
  products, where SpecForge's simulated figure is a product of means;
- starts (one number): the count of full starts;
- cross_entropy, kl (divergence=True, else empty): the target restricted to the
  draft vocabulary and renormalised (pd, SpecForge's training target) against the
  draft q, -sum pd log q and sum pd log(pd / q), at the temperature (1 when greedy).
- expected_prefix, budget_drafts, budget_accepted, budget_expected (with a
  survival estimate, else empty): over full starts, per step the products of
  Σ min(p, q) over drafts 0..k, and budgeted verification's sums per gain bin
  (training.budget_curve).

Truncation. top_k / top_p / min_p (default off) are a request's, with the rules and
order of ops.truncation_cut: then accept is sum_x min(p~(x), q~(x)), p~ the
target's distribution at the temperature truncated by them and renormalised, q~ the
draft's likewise over its own vocabulary (drafting inside the truncation, as the
proposers do). Each row's cut comes from ops.truncation_cut and the logits below it
are set to -inf before ops.vocab_metrics (no host sync). Greedy starts (T <= 0) are
not truncated. The rest is unchanged: a row's argmax is always kept, so the greedy
matches are the same, and cross_entropy and kl stay those of the untruncated
distributions (the head's fit to the whole target; between truncated rows a token
the target keeps and the draft cut would make both +inf).

Exact sums. Every per-pair value is rounded to a multiple of 2**-24 (within 3e-8,
below an fp32 rounding at 1) before summing in float64, so every sum is exact, and
hence the same in any order, on any number of ranks, while its magnitude stays
below 2**29 (5.4e8); beyond that it is ordinary float64 rounding.
"""

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_bool, check_tensor_arg, number_tensor
from specdraft.draft_confidence import row_confidence
from specdraft.layout import sequence_of
from specdraft.ops import truncation_cut, vocab_metrics
from specdraft.training.budget_curve import NUM_BINS, budget_sums

QUANTUM = 2.0**-24  # the grid per-pair values are rounded to: 2**53 * QUANTUM = 2**29 is the exact range


class DraftMetricSums(NamedTuple):
    """float64 sums of `draft_metrics` (module docstring); add them with `combine`,
    all-reduce them with `reduce`, turn them into ratios with `finalize`."""

    count: torch.Tensor  # [K] scored (step, start) pairs
    matches: torch.Tensor  # [K] greedy matches
    accept: torch.Tensor  # [K] sum of sum_x min(p, q)
    accepted_prefix: torch.Tensor  # [K] full starts whose drafts 0..k all match
    starts: torch.Tensor  # [] full starts
    cross_entropy: torch.Tensor  # [K], or [0] without divergence
    kl: torch.Tensor  # [K], or [0] without divergence
    expected_prefix: torch.Tensor  # [K] full starts' products of Σ min(p, q) over drafts 0..k, or [0] without survival
    budget_drafts: torch.Tensor  # [NUM_BINS] full starts' drafts per gain bin (training.budget_curve), or [0]
    budget_accepted: torch.Tensor  # [NUM_BINS] of them, drafts 0..k all matched, or [0]
    budget_expected: torch.Tensor  # [NUM_BINS] of them, products of Σ min(p, q) over drafts 0..k, or [0]


class DraftMetrics(NamedTuple):
    """Ratios from `finalize`; 0 / 0 is NaN (nothing scored)."""

    accuracy: torch.Tensor  # [K] matches / count
    acceptance_rate: torch.Tensor  # [K] accept / count
    accepted_prefix_rate: torch.Tensor  # [K] P(drafts 0..k all accepted), over full starts
    acceptance_length: torch.Tensor  # [] mean accepted drafts per full start (exact; no bonus token)
    marginal_acceptance_length: torch.Tensor  # [] sum_k prod_{j<=k} accuracy_j (SpecForge's simulated figure)
    expected_acceptance_length: torch.Tensor  # [] sum_k prod_{j<=k} acceptance_rate_j (the same with min(p, q))
    cross_entropy: torch.Tensor  # [K] mean per scored pair, or [0]
    kl: torch.Tensor  # [K] mean per scored pair, or [0]


def _exact(values: torch.Tensor) -> torch.Tensor:
    """values in float64 on the QUANTUM grid (scaling by a power of two and rounding are exact)."""
    return torch.round(values.double() / QUANTUM) * QUANTUM


def _sequence_ends(cu_seqlens: torch.Tensor | None, positions: torch.Tensor, total: int) -> torch.Tensor:
    """[T] int64: the end (exclusive) of the sequence holding each position."""
    if cu_seqlens is None:
        return torch.full_like(positions, total)
    bounds = cu_seqlens.long()
    seq = sequence_of(positions, bounds).clamp(0, bounds.shape[0] - 2)
    return bounds.index_select(0, seq + 1)


def _start_temperatures(temperature, total: int, like: torch.Tensor) -> torch.Tensor:
    if isinstance(temperature, bool) or not isinstance(temperature, int | float | torch.SymFloat | torch.Tensor):
        raise ValueError(f"temperature must be a number or an fp32 tensor, got {type(temperature).__name__}")
    if not isinstance(temperature, torch.Tensor):
        return number_tensor(temperature, torch.float32, like.device).expand(total)
    check_tensor_arg("temperature", temperature, torch.float32, shape=[(), (total,)], device_of=like)
    return temperature.expand(total)


def off_value(name: str) -> int | float:
    """The truncation parameter's off value (top_k 0, top_p 1.0, min_p 0.0). Literals
    in code, not a module-level table: torch.compile(dynamic=True) traces a float
    read from a module's dict as a symbol, and comparing it would pin it and make
    Dynamo trace the whole function a second time."""
    return 0 if name == "top_k" else (1.0 if name == "top_p" else 0.0)


def check_truncation_numbers(top_k, top_p, min_p) -> None:
    """One request's truncation as Python numbers (what DraftEvaluator takes): top_k
    an int (<= 0 or >= the vocabulary: off), top_p in (0, 1] (1: off), min_p in
    [0, 1] (0: off); a ValueError names the argument."""
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise ValueError(f"top_k must be an int (<= 0: off), got {top_k!r}")
    for name, value, low_open in (("top_p", top_p, True), ("min_p", min_p, False)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be a number, got {value!r}")
        if not ((value > 0) if low_open else (value >= 0)) or not value <= 1:  # NaN fails both
            bound = "(0, 1] (1: off)" if low_open else "[0, 1] (0: off)"
            raise ValueError(f"{name} must be in {bound}, got {value!r}")


def _start_truncation(top_k, top_p, min_p, total: int, like: torch.Tensor):
    """(top_k int, top_p fp32, min_p fp32), each [T] (one per start; a number or a
    0-dim tensor expanded, not copied); None when all three are numbers and off."""
    # None is off without a comparison: torch.compile(dynamic=True) traces a Python
    # float default as a symbol, the off test below would pin it, and Dynamo would
    # trace the whole function a second time.
    if top_k is None and top_p is None and min_p is None:
        return None
    given = {name: off_value(name) if value is None else value
             for name, value in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p))}  # fmt: skip
    numbers = {name: value for name, value in given.items() if not isinstance(value, torch.Tensor)}
    check_truncation_numbers(**{name: off_value(name) for name in given} | numbers)
    if len(numbers) == 3 and numbers["top_k"] <= 0 and numbers["top_p"] >= 1 and numbers["min_p"] <= 0:
        return None
    columns = []
    for name, value in given.items():
        dtypes = INDEX_DTYPES if name == "top_k" else (torch.float32,)
        if isinstance(value, torch.Tensor):
            check_tensor_arg(name, value, dtypes, shape=[(), (total,)], device_of=like)
        else:
            if name == "top_k":  # <= 0 and >= V are both off: int32 holds every top_k that is not
                value = min(max(value, -1), 2**31 - 1)
            value = number_tensor(value, dtypes[0], like.device)
        columns.append(value.expand(total))
    return tuple(columns)


def _truncated(values: torch.Tensor, temperatures: torch.Tensor, truncation, probs: bool) -> torch.Tensor:
    """values [n, V] (the first n starts' rows) with every entry below its row's cut
    (ops.truncation_cut, with those starts' parameters) removed: -inf logits, or 0
    probabilities (cut on their log, the logits they stand for). NaN stays NaN."""
    n = values.shape[0]
    keys = values.log() if probs else values
    cut = truncation_cut(keys, *(column[:n].contiguous() for column in (temperatures, *truncation)))
    return torch.where(keys < cut[:, None], 0.0 if probs else float("-inf"), values)


def draft_metrics(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    *,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    target_is_probs: bool = False,
    divergence: bool = False,
    survival: torch.Tensor | str | None = None,
) -> DraftMetricSums:
    """Per-step float64 sums of the draft's agreement with the target (module docstring).

    draft_logits [K, T, Vd] (step k's logits at every start t; rows contiguous),
    target_logits [T, V] (the target's output at every position, or probabilities
    with target_is_probs), fp32 / bf16 / fp16. loss_mask [T] bool or integer (None:
    every row scored). temperature: a number, a 0-dim fp32 tensor, or fp32 [T] (per
    start t); T <= 0 is greedy. top_k, top_p, min_p: the truncation of accept (module
    docstring), each None (off, the default), a number, a 0-dim tensor or [T] (per
    start; top_k int32 / int64, top_p and min_p fp32; a tensor's values are not
    checked: ops.truncation_cut's rules). d2t [Vd]: draft id i is target id i + d2t[i] (None:
    Vd == V). cu_seqlens [B + 1] int32/int64: packed sequences (None: one sequence);
    its last entry must be T. survival: the sums of budgeted verification
    (training.budget_curve) by these estimates, [K, T] float (step k's at start t:
    DSpark's confidence head), or "draft" for the draft's confidence, the largest
    probability of step k's distribution (at the temperature and inside the
    truncation; T = 1 when greedy), as SpeculativeDecoder(budget=...) ranks a chain's
    drafts; None (default): those fields empty. Not differentiable: the logits are
    detached.
    """
    check_tensor_arg("draft_logits", draft_logits, FLOAT_DTYPES, shape=(at_least(1, "K"), None, at_least(1, "Vd")),
                     contiguous="rows")  # fmt: skip
    num_steps, total, _ = draft_logits.shape
    check_tensor_arg("target_logits", target_logits, FLOAT_DTYPES, shape=(total, at_least(1, "V")),
                     contiguous="rows", device_of=draft_logits)  # fmt: skip
    check_tensor_arg("loss_mask", loss_mask, (torch.bool, *INDEX_DTYPES), shape=(total,), device_of=draft_logits,
                     optional=True)  # fmt: skip
    check_tensor_arg("cu_seqlens", cu_seqlens, INDEX_DTYPES, shape=(at_least(2, "B + 1"),), contiguous=True,
                     device_of=draft_logits, optional=True)  # fmt: skip
    check_bool("divergence", divergence)
    if isinstance(survival, torch.Tensor):
        check_tensor_arg("survival", survival, FLOAT_DTYPES, shape=(num_steps, total), device_of=draft_logits)
    elif survival not in (None, "draft"):
        raise ValueError(f'survival must be None, "draft" or a [K, T] float tensor, got {survival!r}')
    temperatures = _start_temperatures(temperature, total, draft_logits)
    draft_logits, target_logits = draft_logits.detach(), target_logits.detach()
    device = draft_logits.device

    positions = torch.arange(total, device=device)
    rows = positions + torch.arange(num_steps, device=device)[:, None] + 1  # [K, T]: the target row of (k, t)
    row_scored = torch.ones(total, dtype=torch.bool, device=device) if loss_mask is None else loss_mask != 0
    row_scored = F.pad(row_scored, (0, num_steps + 1))  # rows past the end: never scored
    scored = (rows < _sequence_ends(cu_seqlens, positions, total)) & row_scored[rows]

    truncation = _start_truncation(top_k, top_p, min_p, total, draft_logits)
    if isinstance(temperature, int | float) and not temperature > 0:
        truncation = None  # greedy: nothing to truncate
    truncated_target = None
    if truncation is not None and not any(isinstance(v, torch.Tensor) and v.dim() == 1
                                          for v in (temperature, top_k, top_p, min_p)):  # fmt: skip
        # One setting for every start: a target row's cut is the same at every step.
        truncated_target = _truncated(target_logits, temperatures, truncation, target_is_probs)

    columns = []  # per step: the op's outputs, padded to T (the padding is never scored)
    for k in range(num_steps):
        target_rows = target_logits[k + 1 :]
        n = target_rows.shape[0]
        draft_rows, options = draft_logits[k, :n], {"d2t": d2t, "target_is_probs": target_is_probs}
        out = None
        if truncation is None or divergence:
            out = vocab_metrics(draft_rows, target_rows, temperatures[:n], divergence=divergence, **options)
        accept = None if out is None else out.accept
        if truncation is not None:
            if truncated_target is None:
                target_part = _truncated(target_rows, temperatures, truncation, target_is_probs)
            else:
                target_part = truncated_target[k + 1 :]
            draft_part = _truncated(draft_rows, temperatures, truncation, False)
            inside = vocab_metrics(draft_part, target_part, temperatures[:n], **options)
            out, accept = inside if out is None else out, inside.accept  # argmaxes are kept: the same tokens
        values = (out.draft_token == out.target_token, accept)
        values += (out.cross_entropy, out.kl) if divergence else ()
        if survival == "draft":
            values += (row_confidence(draft_rows if truncation is None else draft_part, temperatures[:n]),)
        columns.append([F.pad(v, (0, k + 1)) for v in values])
    match, accept, *rest = (torch.stack(c) for c in zip(*columns, strict=True))
    divergences = rest[:2] if divergence else []
    if survival == "draft":
        survival = rest[-1]

    def step_sums(values: torch.Tensor) -> torch.Tensor:
        return torch.where(scored, _exact(values), 0.0).sum(1)

    matched = match & scored
    full = scored.all(0)
    prefix = torch.cumprod(matched.long(), 0) * full  # [K, T]: drafts 0..k all matched, full starts only
    empty = torch.zeros(0, dtype=torch.float64, device=device)
    no_divergence = empty
    budget = (empty.clone(), empty.clone(), empty.clone(), empty.clone())
    if survival is not None:
        expected = _exact(torch.cumprod(torch.where(scored, accept.double(), 0.0), 0)) * full
        budget = (expected.sum(1), *budget_sums(survival, prefix, expected, full))
    return DraftMetricSums(
        count=scored.sum(1).double(),
        matches=matched.sum(1).double(),
        accept=step_sums(accept),
        accepted_prefix=prefix.sum(1).double(),
        starts=full.sum().double(),
        cross_entropy=step_sums(divergences[0]) if divergence else no_divergence,
        kl=step_sums(divergences[1]) if divergence else no_divergence.clone(),
        expected_prefix=budget[0],
        budget_drafts=budget[1],
        budget_accepted=budget[2],
        budget_expected=budget[3],
    )


def combine(a: DraftMetricSums, b: DraftMetricSums) -> DraftMetricSums:
    """Field-wise a + b: the sums of two batches (exact, module docstring)."""
    return DraftMetricSums(*(x + y for x, y in zip(a, b, strict=True)))


def zero_sums(num_steps: int, divergence: bool = False, device: torch.device | str = "cpu",
              budget: bool = False) -> DraftMetricSums:  # fmt: skip
    """The sums of no data, shaped as `draft_metrics` returns them for num_steps
    (what a rank with nothing to evaluate contributes to `reduce`); budget: as with
    a survival estimate."""

    def zeros(size: int) -> torch.Tensor:
        return torch.zeros(size, dtype=torch.float64, device=device)

    divergences = num_steps if divergence else 0
    bins = NUM_BINS if budget else 0
    return DraftMetricSums(
        count=zeros(num_steps), matches=zeros(num_steps), accept=zeros(num_steps), accepted_prefix=zeros(num_steps),
        starts=zeros(1)[0], cross_entropy=zeros(divergences), kl=zeros(divergences),
        expected_prefix=zeros(num_steps if budget else 0), budget_drafts=zeros(bins), budget_accepted=zeros(bins),
        budget_expected=zeros(bins),
    )  # fmt: skip


def reduce(sums: DraftMetricSums, group=None) -> DraftMetricSums:
    """All-reduce (sum) every field across the ranks of `group` in one collective:
    the fields are flattened into one float64 buffer. Outside torch.distributed (not
    initialised) returns `sums` unchanged. With NCCL the sums must be on the GPU."""
    if not (dist.is_available() and dist.is_initialized()):
        return sums
    flat = torch.cat([field.reshape(-1) for field in sums])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    pieces = torch.split(flat, [field.numel() for field in sums])
    return DraftMetricSums(*(piece.reshape(field.shape) for piece, field in zip(pieces, sums, strict=True)))


def finalize(sums: DraftMetricSums) -> DraftMetrics:
    """Ratios from sums (tensors; no host sync). acceptance_length is the number of
    accepted drafts per verification; add 1 for tokens per target step (the bonus)."""
    accuracy = sums.matches / sums.count
    acceptance_rate = sums.accept / sums.count
    divergence_count = sums.count[: sums.cross_entropy.shape[0]]
    return DraftMetrics(
        accuracy=accuracy,
        acceptance_rate=acceptance_rate,
        accepted_prefix_rate=sums.accepted_prefix / sums.starts,
        acceptance_length=sums.accepted_prefix.sum() / sums.starts,
        marginal_acceptance_length=torch.cumprod(accuracy, 0).sum(),
        expected_acceptance_length=torch.cumprod(acceptance_rate, 0).sum(),
        cross_entropy=sums.cross_entropy / divergence_count,
        kl=sums.kl / divergence_count,
    )
