"""Evaluate a draft head on saved target outputs: the unroll and the metrics as one
compiled step per packed batch, summed exactly over every batch.

    evaluator = DraftEvaluator(head, num_steps=3)           # compiled once, dynamic
    sums = evaluate(evaluator, shard_paths("data/"))        # a progress bar per shard
    print(format_table(finalize(sums), sums))

The step (`DraftEvaluator.__call__`) is `unroll_for_eval` followed by `draft_metrics`
under torch.compile(fullgraph=True, dynamic=True): no host sync, one graph for
every batch length and sequence count, and no autograd state whatever the caller's
grad mode, so a training loop can call it between optimizer steps.

A block drafter (DFlash, DSpark: loop "block") is evaluated the same way with its
blocks in place of the unroll's chains: for every chain start t the block anchored
at row t + 1 (`specdraft.training.block.start_anchors`), whose row k drafts what
chain step k drafts, all in one `block_forward_for_eval`. Then accepted_prefix
summed over k is, per full start, the accepted prefix of the block's first K drafts
under greedy verification along the data; DeepSpec's evaluator counts that plus one
(the target's own token) per verification, `finalize(sums).acceptance_length + 1`,
and its accept_rate@k is `accepted_prefix_rate[k]`.

With budget=True the sums also hold budgeted verification's curve
(`training.budget_curve`): the acceptance length against the drafts verified per
start when the positions of largest expected gain are verified first, ranked by the
draft's confidence (a DSpark head: its confidence head), beside fixed K.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdraft.checks import check_bool, check_int_range
from specdraft.training.block import block_forward_for_eval, start_anchors
from specdraft.training.metrics import DraftMetricSums, check_truncation_numbers, combine, draft_metrics, finalize
from specdraft.training.shards import TargetBatch, load_batch, split_batch
from specdraft.training.unroll import LOOPS, TOKEN_MODES, unroll_for_eval

EVAL_LOOPS = (*LOOPS, "block")


class DraftEvaluator:
    """One evaluation step for `head` (module docstring).

    num_steps: K draft steps per start (a block drafter: its first K <= block_size
    drafts). temperature: a number (<= 0 greedy); the expected acceptance Σ min(p, q)
    is taken at it. top_k, top_p, min_p: a request's truncation, one setting for the
    whole evaluation as the temperature (an int, <= 0 off; (0, 1], 1 off; [0, 1], 0
    off): Σ min(p~, q~) of both distributions truncated and renormalised, the draft
    sampling inside the truncation (training.metrics' Truncation; ignored when
    greedy). tokens: "draft" (the head's own greedy drafts, as served) or
    "data" (teacher forcing). loop: "auto" picks the head's proposer loop (its
    `draft_loop`: "multi_layer" for MTP heads with several layers,
    MultiLayerEagleProposer; "block" for block drafters, BlockProposer; "eagle"
    otherwise). compile: True, False, or a dict of torch.compile options (default
    fullgraph=True, dynamic=True). budget: also sum budgeted verification's curve
    (module docstring).
    """

    def __init__(self, head: torch.nn.Module, *, num_steps: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, tokens: str = "draft", loop: str = "auto",
                 divergence: bool = False, budget: bool = False, compile: bool | dict = True) -> None:  # fmt: skip
        check_int_range("num_steps", num_steps, 1)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature != temperature:
            raise ValueError(f"temperature must be a number (<= 0: greedy), got {temperature!r}")
        check_truncation_numbers(top_k, top_p, min_p)
        if loop not in ("auto", *EVAL_LOOPS):
            raise ValueError(f"loop must be one of {('auto', *EVAL_LOOPS)}, got {loop!r}")
        if tokens not in TOKEN_MODES:
            raise ValueError(f"tokens must be one of {TOKEN_MODES}, got {tokens!r}")
        if not isinstance(compile, (bool, dict)):
            raise ValueError(f"compile must be a bool or a dict of torch.compile options, got {type(compile).__name__}")
        self.head = head
        self.num_steps = num_steps
        self.temperature = float(temperature)
        self.truncation = {"top_k": top_k, "top_p": float(top_p), "min_p": float(min_p)}
        self.tokens = tokens
        self.loop = head.draft_loop if loop == "auto" else loop
        check_block_loop(head, self.loop, num_steps)
        self.divergence = divergence
        check_bool("budget", budget)
        self.budget = budget
        self.step = self.metrics_of
        if compile is not False:
            options = {"fullgraph": True, "dynamic": True, **(compile if isinstance(compile, dict) else {})}
            self.step = torch.compile(self.metrics_of, **options)

    def metrics_of(self, batch: TargetBatch) -> DraftMetricSums:
        """Unroll (or blocks) then metrics for one batch (what gets compiled)."""
        survival = "draft" if self.budget else None
        if self.loop == "block":
            logits, confidence = self.block_logits(batch)
            if self.budget and confidence is not None:
                survival = torch.sigmoid(confidence.float())
        else:
            logits = unroll_for_eval(
                self.head, *batch.unroll_args(), num_steps=self.num_steps, tokens=self.tokens, loop=self.loop
            ).logits
        return draft_metrics(
            logits, batch.target_logits, batch.loss_mask, self.temperature, **self.truncation,
            d2t=self.head.vocab_map, cu_seqlens=batch.cu_seqlens, divergence=self.divergence, survival=survival,
        )  # fmt: skip

    def block_logits(self, batch: TargetBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """([K, T, V], [K, T] or None): row k of the block anchored at t + 1, for every
        start t, and its confidence logit (a DSpark head with a confidence head)."""
        anchors, valid = start_anchors(batch.cu_seqlens, batch.num_tokens)
        out = block_forward_for_eval(self.head, *batch.unroll_args(), anchors, valid, tokens=self.tokens)
        logits = out.logits[:, : self.num_steps].transpose(0, 1).contiguous()
        if out.confidence is None:
            return logits, None
        return logits, out.confidence[:, : self.num_steps].transpose(0, 1).contiguous()

    @torch.no_grad()
    def __call__(self, batch: TargetBatch) -> DraftMetricSums:
        # One empty sequence appended: it changes no sum, and it keeps cu_seqlens at
        # 3 entries or more, so a one-sequence batch reuses the dynamic graph (a
        # symbolic size that may be 1 is guarded on, and a batch of one would
        # compile a second graph).
        cu_seqlens = torch.cat([batch.cu_seqlens, batch.cu_seqlens[-1:]])
        with specialized_floats():
            return self.step(batch._replace(cu_seqlens=cu_seqlens))


def specialized_floats():
    """Dynamo with every Python float the step reads held constant. Under dynamic=True
    it would trace the floats (the temperature, top-p, the norms' eps, RoPE's theta)
    as symbols, find some it cannot turn into tensors, and restart the whole
    analysis with them constant: the step traced twice (K = 7 on a 2-core CPU: a cold
    first call of 215 s, of which the failed first attempt took 45 s). Constant from
    the start, each float is guarded on its value either way."""
    return torch._dynamo.config.patch(specialize_float=True)


def check_block_loop(head: torch.nn.Module, loop: str, num_steps: int) -> None:
    """A block drafter evaluates in loop "block" with num_steps <= its block_size,
    and only a block drafter does."""
    is_block = getattr(head, "draft_loop", None) == "block"
    if loop == "block" and not is_block:
        raise ValueError(f"loop 'block' needs a block drafter (BlockDraftHead), got {type(head).__name__}")
    if is_block:
        head.check_loop(loop)
        if num_steps > head.block_size:
            raise ValueError(f"num_steps = {num_steps} exceeds the head's block_size {head.block_size}: a block "
                             "drafts at most block_size tokens")  # fmt: skip


def head_device(head: torch.nn.Module) -> torch.device:
    return next(head.parameters()).device


def evaluate(
    evaluator: DraftEvaluator,
    batches: Iterable[TargetBatch | str | Path],
    *,
    max_batch_tokens: int | None = None,
    progress: bool = True,
) -> tuple[DraftMetricSums, dict[str, float]]:
    """Sum the metrics of every batch (TargetBatches, or shard paths read one at a
    time onto the head's device). max_batch_tokens: split each batch into groups of
    whole sequences of at most that many rows (`split_batch`; the sums are the
    same, the dense attention's T^2 smaller). Returns (the exact sums, timing: tokens, seconds,
    tokens_per_s, first_batch_s: the first batch's time, which holds the compile, and
    after_first_tokens / after_first_s: the rest, the steady rate without the compile).
    The progress bar shows the running greedy acceptance length (a host read between
    batches, never inside the compiled step)."""
    items = list(batches)
    device = head_device(evaluator.head)
    total, tokens, first_batch_s, first_tokens = None, 0, 0.0, 0
    start = time.perf_counter()
    bar = tqdm(items, desc="evaluate", unit="batch", disable=not progress)
    for i, item in enumerate(bar):
        batch = load_batch(item, device) if isinstance(item, (str, Path)) else item.to(device)
        for part in [batch] if max_batch_tokens is None else split_batch(batch, max_batch_tokens):
            sums = evaluator(part)
            total = sums if total is None else combine(total, sums)
        tokens += batch.num_tokens
        if i == 0:
            first_batch_s, first_tokens = time.perf_counter() - start, tokens
        bar.set_postfix(tokens=tokens, acceptance=f"{float(finalize(total).acceptance_length):.3f}")
    if total is None:
        raise ValueError("batches: nothing to evaluate")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    timing = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "first_batch_s": first_batch_s,
              "after_first_tokens": tokens - first_tokens, "after_first_s": seconds - first_batch_s}  # fmt: skip
    return total, timing
