"""The decoder: prefill, then iterations of verify -> rejection sampling -> propose,
with the host loop (stop conditions, timing, progress) around them.

One iteration (`SpeculativeDecoder.iteration`) is a function of tensors only (the
state, the fixed per-request tensors) with Python ints for every bound (K, block
size, the block table's reach), so `torch.compile(decoder.iteration,
fullgraph=True)` traces it whole and, with mode="reduce-overhead" on CUDA, replays
it as one graph. The host reads one [2, B] tensor (done flags and token counts)
per iteration, between iterations.
"""

import dataclasses
from typing import NamedTuple

import torch

from specdraft.config import SamplingParams
from specdraft.layout import BatchMetadata
from specdraft.models import default_aux_layers
from specdraft.models.regions import in_layer_regions

from . import checks
from .budget import (
    calibrated,
    check_budget,
    check_calibration,
    kept_drafts,
    packed_windows,
    survival_from,
    updated_calibration,
)
from .run_budget import RunBudget
from .state import DecodeState, Requests, captures_cuda_graphs, commit, initial_state, owned_copy
from .stats import Clock, GenerationStats, Timings, build_stats, host_flags, progress_bar
from .step_costs import Choice, StepCosts
from .verify import greedy_tokens, prompt_batch, sample_target, window_batch


class GenerationResult(NamedTuple):
    tokens: list[torch.Tensor]  # per request: its generated ids, 1-D int32 on the CPU (EOS included)
    stats: GenerationStats


class Verified(NamedTuple):
    """What the draft half of an iteration needs from the verify half, for chains and
    trees alike: the window the draft passes over, W rows per request (a chain: the
    last token and its K drafts, W = K + 1; a tree: the root and the accepted path,
    then padding, tree_decoder.py), and what the verify emitted."""

    token_ids: torch.Tensor  # [B * W] int32: each request's window
    positions: torch.Tensor  # [B * W] int64
    hidden_states: torch.Tensor  # [B * W, H]: what the draft reads at those rows (EAGLE-3: aux states)
    sampled: torch.Tensor  # [B, W] int32: the accepted drafts, the target's own token (bonus / recovered), then -1
    counts: torch.Tensor  # [B] int: accepted drafts (the target's own token sits at sampled[:, counts])
    lens: torch.Tensor  # [B] int64: positions of the last tokens, before this pass
    last_tokens: torch.Tensor  # [B] int32, before this pass
    done: torch.Tensor  # [B] bool, before this pass
    metadata: BatchMetadata | None = None  # a budgeted pass's packed windows (None: K + 1 rows per request)
    num_drafts: torch.Tensor | None = None  # [B] int32: drafts each request verified (None: K)


def num_kv_blocks(num_reqs: int, max_model_len: int, num_speculative_tokens: int, block_size: int) -> int:
    """KV-cache blocks (of each layer, target and draft alike) generate needs for a
    batch of num_reqs prompts: every request gets ceil((max_model_len + K) /
    block_size) blocks."""
    return num_reqs * checks.blocks_per_request(max_model_len, num_speculative_tokens, block_size)


class SpeculativeDecoder(RunBudget):
    """Speculative decoding of a batch of prompts with `target` and `proposer`
    (EagleProposer for EAGLE-1 / EAGLE-3 / MTP heads, MultiLayerEagleProposer,
    AutoregressiveSpeculator, BlockProposer for DFlash / DSpark heads), or plain
    decoding of the target when proposer is None.

    target: a model like TinyTargetModel: forward(input_ids, positions,
    attn_metadata, kv_caches, aux_layers=()) -> (final hidden after norm, aux or
    None), compute_logits(hidden), allocate_kv_caches(num_blocks, block_size),
    config.vocab_size / hidden_size / num_layers. The draft reads the target's final
    hidden state (EAGLE-1, MTP) or, when its head's reads_aux_hidden_states is True
    (EAGLE-3, block drafters), its aux hidden states (aux_layers, concatenated:
    default default_aux_layers(num_layers); a block drafter's are those its
    target_layer_ids name, DraftHead.aux_layers_for).

    max_model_len, block_size: the proposer's config (pass them only for plain
    decoding; a value that differs from the config is an error). compile: False, True
    (torch.compile(fullgraph=True, dynamic=False)) or a dict of torch.compile options
    (e.g. {"mode": "reduce-overhead"}, {"backend": "aot_eager"}, {"dynamic": None}),
    applied to the iteration (and to its two halves with time_split). The prefill
    runs eagerly.

    budget: None (every request verifies its K drafts) or an int >= 0, the most drafts
    verified per iteration over the whole batch: each iteration keeps the drafts with
    the best expected gain (generation/budget.py) and verifies them in a pass of
    B + min(budget, B * K) rows; 0 decodes plainly (no draft pass). Or a StepCosts
    table (generation/step_costs.py): each run takes the budget with the most expected
    tokens per second at its batch size, from the table's measured iteration times and
    the acceptance rates of the decoder's last run (the table's own at first), and runs
    it as plain decoding or the fixed-k iteration where it is one of those
    (run_budget.take_choice). Needs a
    chain or block proposer returning survival estimates
    (SpeculativeConfig(return_draft_confidence=True), or a DSpark confidence head).
    calibration: None, or with a budget the newest pass's weight in (0, 1] of running
    per-position acceptance rates (an EMA kept on the device over a run's passes) that
    scale the survival estimates before the allocation (budget.calibrated).
    A compiled iteration is reused by every later run with the same
    batch size and the same all-greedy-or-not sampling (max_new_tokens, prompts,
    temperatures and seeds are tensors or host-side values it does not depend on).

    The target's KV caches are allocated on first use (num_kv_blocks blocks), or
    passed as target_kv_caches; the draft's are the proposer's. Both use one block
    table: request b owns blocks b * n .. b * n + n - 1.
    """

    truncates = True  # verifies against a request's top-k / top-p / min-p (trees: not yet)

    def __init__(
        self,
        target: torch.nn.Module,
        proposer=None,
        *,
        max_model_len: int | None = None,
        block_size: int | None = None,
        aux_layers: tuple[int, ...] | None = None,
        compile: bool | dict = False,
        target_kv_caches: list[torch.Tensor] | None = None,
        budget: int | None = None,
        calibration: float | None = None,
    ) -> None:
        checks.check_target(target)
        self.budget_policy = check_budget(budget, proposer)
        self.calibration = check_calibration(calibration, budget)
        self.budget = budget if isinstance(budget, int) else None  # a StepCosts table chooses it per run
        self.acceptance_rates = budget.rates if isinstance(budget, StepCosts) else None
        self.full_proposer, self.fewer_drafts = proposer, {}  # a table's choices' proposers, by (k, fixed)
        self.run_choices: dict[int, Choice] = {}  # a table's choice per batch size, kept between runs
        self.target = target
        self.proposer = proposer
        if proposer is not None:
            config = proposer.config
            for name, value in (("max_model_len", max_model_len), ("block_size", block_size)):
                if value is not None and value != getattr(config, name):
                    raise ValueError(
                        f"{name}: {value} differs from the proposer's config.{name} {getattr(config, name)}"
                    )
            max_model_len, block_size = config.max_model_len, config.block_size
            self.feeds_aux = proposer.reads_hidden and proposer.model.reads_aux_hidden_states
            self.k = proposer.num_speculative_tokens
        else:
            if max_model_len is None:
                raise ValueError("max_model_len: required for plain decoding (no proposer config to take it from)")
            block_size = 16 if block_size is None else block_size
            self.feeds_aux = False
            self.k = 0
        self.max_model_len = checks.positive_int("max_model_len", max_model_len)
        self.block_size = checks.positive_int("block_size", block_size)
        aux_layers_for = getattr(proposer.model, "aux_layers_for", None) if proposer is not None else None
        named = aux_layers_for(target.config.num_layers, aux_layers) if aux_layers_for is not None else None
        if named is not None:  # the head names its layers (a block drafter)
            aux_layers = named
        elif aux_layers is None:
            aux_layers = default_aux_layers(target.config.num_layers) if self.feeds_aux else ()
        self.aux_layers = checks.check_aux_layers(aux_layers, target.config.num_layers)
        if proposer is not None:
            checks.check_proposer(proposer, target, self.aux_layers, self.feeds_aux)
            self.use_draft_probs = (
                proposer.config.draft_sampling == "probabilistic" and proposer.config.return_probs == "probs"
            )
        self.blocks_per_request = checks.blocks_per_request(self.max_model_len, self.k, self.block_size)
        self.reach = self.blocks_per_request * self.block_size  # attention's static max_seq_len
        self.target_kv_caches = None
        self.owns_target_caches = False
        if target_kv_caches is not None:
            self._set_target_caches(list(target_kv_caches))
        self.compile_options = None if compile is False else ({} if compile is True else dict(compile))
        fns = {"iteration": self.iteration, "verify": self.verify, "draft": self.draft}
        if self.compile_options is not None:
            # Static shapes unless asked otherwise: a new batch size compiles a graph of
            # its own instead of Dynamo's automatic switch to a slower dynamic one.
            options = {"dynamic": False, **self.compile_options}
            fns = {name: torch.compile(fn, fullgraph=True, **options) for name, fn in fns.items()}
            if options["dynamic"] is False:
                # Static shapes: the layers' parts around the attention as compile
                # regions too (models/regions.py), one layer's code for all of them.
                fns = {name: in_layer_regions(fn) for name, fn in fns.items()}
        self.compiled = fns

    # ------------------------------------------------------------------ caches

    def _set_target_caches(self, caches: list[torch.Tensor]) -> None:
        if len(caches) != target_num_kv_layers(self.target):
            raise ValueError(f"target_kv_caches must hold one cache per target layer, got {len(caches)}")
        for i, cache in enumerate(caches):
            if cache.dim() != 5 or cache.shape[2] != self.block_size:
                raise ValueError(f"target_kv_caches[{i}] must be [2, blocks, {self.block_size}, heads, dim]")
            # Written in place every pass: a static address keeps a CUDA graph valid.
            torch._dynamo.mark_static_address(cache)
        self.target_kv_caches = caches

    def _ensure_target_caches(self, num_blocks: int) -> None:
        # Caches this decoder allocated grow with the batch (new addresses: a compiled
        # iteration recompiles once); caches the caller passed must be large enough.
        if self.target_kv_caches is None or (
            self.owns_target_caches and self.target_kv_caches[0].shape[1] < num_blocks
        ):
            self._set_target_caches(self.target.allocate_kv_caches(num_blocks, self.block_size))
            self.owns_target_caches = True
        elif self.target_kv_caches[0].shape[1] < num_blocks:
            raise ValueError(
                f"target_kv_caches hold {self.target_kv_caches[0].shape[1]} blocks; this batch needs {num_blocks}"
            )

    # --------------------------------------------------------------- one pass

    def run_target(self, token_ids, positions, metadata):
        """(final hidden [T, H], what the draft reads [T, H or 3H]; plain decoding:
        no aux layers)."""
        if self.aux_layers and self.proposer is not None:
            hidden, aux = self.target(token_ids, positions, metadata, self.target_kv_caches, aux_layers=self.aux_layers)
        else:
            hidden, aux = self.target(token_ids, positions, metadata, self.target_kv_caches)
        return hidden, (aux if self.feeds_aux else hidden)

    def prefill(self, prompts: list[torch.Tensor], requests: Requests) -> DecodeState:
        """The target over every prompt (writing its cache), each request's first token
        sampled from its last prompt row, then the draft's first propose over the
        prompts with that token as next token."""
        token_ids, positions, metadata, last_rows = prompt_batch(
            prompts, requests.block_table, self.block_size, self.reach
        )
        hidden, draft_hidden = self.run_target(token_ids, positions, metadata)
        logits = self.target.compute_logits(hidden.index_select(0, last_rows))
        prompt_lens = metadata.seq_lens.long()
        first, _ = sample_target(logits[:, None], None, None, requests, prompt_lens)
        # The output buffer's width is fixed by the decoder, not by this run's limits:
        # a shape that followed max_new_tokens would recompile the iteration whenever
        # a run asked for a different length.
        width = self.max_model_len + self.k + 1
        state = initial_state(first[:, 0], prompt_lens, requests, self.k, width)
        if self.calibration is not None:
            rates = torch.zeros(2, self.k, dtype=torch.float32, device=first.device)
            state = dataclasses.replace(state, calibration=rates)
        if self.proposer is None:
            return state
        return self.draft_after_prefill(state, token_ids, positions, draft_hidden, metadata, requests)

    def draft_after_prefill(self, state: DecodeState, token_ids, positions, draft_hidden, metadata, requests):
        """The draft's first propose, over the prompts, from each request's first token."""
        out = self.proposer.propose(token_ids, positions, draft_hidden, state.last_tokens, metadata, requests.sampling)
        return self.with_drafts(state, out)

    def with_drafts(self, state: DecodeState, out) -> DecodeState:
        """The state carrying a propose's drafts (and what verifying them reads)."""
        probs = out.draft_probs.contiguous() if self.use_draft_probs else None
        survival = survival_from(out) if self.budget is not None else None
        return dataclasses.replace(state, drafts=out.draft_tokens.contiguous(), draft_probs=probs, survival=survival)

    def verify(self, state: DecodeState, requests: Requests) -> tuple[DecodeState, Verified]:
        """The target over [last token, K drafts] of every request, rejection sampling
        and the commit of what it emitted (plain decoding: [last token] only; under a
        budget, `verify_budgeted`)."""
        if self.budget is not None:
            return self.verify_budgeted(state, requests)
        width = self.k + 1
        if self.k:
            token_ids = torch.cat([state.last_tokens[:, None], state.drafts], dim=1).reshape(-1)
        else:
            token_ids = state.last_tokens
        positions, metadata = window_batch(state.lens, width, requests.block_table, self.block_size, self.reach)
        hidden, draft_hidden = self.run_target(token_ids, positions, metadata)
        logits = self.target.compute_logits(hidden).view(state.lens.shape[0], width, -1)
        drafts = state.drafts if self.k else None
        sampled, counts = sample_target(logits, drafts, state.draft_probs, requests, state.lens + 1)
        verified = Verified(token_ids, positions, draft_hidden, sampled, counts, state.lens, state.last_tokens,
                            state.done)  # fmt: skip
        return commit(state, sampled, counts, requests), verified

    def verify_budgeted(self, state: DecodeState, requests: Requests) -> tuple[DecodeState, Verified]:
        """The target over each request's last token and the drafts the budget keeps,
        packed into B + min(budget, B * K) rows (generation/budget.py); rejection
        sampling of each request's kept drafts, and the commit."""
        num_reqs = state.lens.shape[0]
        num_drafts = kept_drafts(calibrated(state.survival, state.calibration), state.done, requests.budget)
        num_rows = num_reqs + min(self.budget, num_reqs * self.k)
        packed = packed_windows(state.last_tokens, state.drafts, state.lens, num_drafts, num_rows,
                                requests.block_table, self.block_size, self.reach)  # fmt: skip
        hidden, draft_hidden = self.run_target(packed.token_ids, packed.positions, packed.metadata)
        logits = self.target.compute_logits(hidden)  # [T, V]
        if requests.all_greedy:  # the argmax of the packed rows, then per request
            target = logits.argmax(dim=-1).index_select(0, packed.rows.reshape(-1)).view(num_reqs, -1)
            sampled, counts = greedy_tokens(target, state.drafts, num_drafts)
        else:
            per_request = logits.index_select(0, packed.rows.reshape(-1)).view(num_reqs, self.k + 1, -1)
            sampled, counts = sample_target(per_request, state.drafts, state.draft_probs, requests, state.lens + 1,
                                            num_drafts)  # fmt: skip
        verified = Verified(packed.token_ids, packed.positions, draft_hidden, sampled, counts, state.lens,
                            state.last_tokens, state.done, packed.metadata, num_drafts)  # fmt: skip
        committed = commit(state, sampled, counts, requests, num_drafts)
        if state.calibration is not None:
            rates = updated_calibration(state.calibration, state.survival, counts, num_drafts, state.done,
                                        self.calibration)  # fmt: skip
            committed = dataclasses.replace(committed, calibration=rates)
        return committed, verified

    def draft(self, state: DecodeState, verified: Verified, requests: Requests) -> DecodeState:
        """The proposer's padded path over the verified windows: each request samples
        after its last accepted token; rejected tokens stay as padding, and their KV
        slots are rewritten by the next pass (positions restart from the accepted
        length). Finished requests are discarded (they draft from their last token)."""
        if self.k == 0 or self.budget == 0:
            return state
        num_reqs = state.lens.shape[0]
        if verified.metadata is None:
            _, metadata = window_batch(verified.lens, self.k + 1, requests.block_table, self.block_size, self.reach)
            cu_num_draft_tokens = torch.arange(1, num_reqs + 1, dtype=torch.int32, device=state.lens.device) * self.k
        else:
            metadata = verified.metadata
            cu_num_draft_tokens = verified.num_drafts.cumsum(0).to(torch.int32)
        out = self.proposer.propose_padded(
            verified.token_ids, verified.positions, verified.hidden_states, verified.sampled, cu_num_draft_tokens,
            verified.last_tokens, metadata, requests.sampling, discard_request_mask=verified.done,
        )  # fmt: skip
        return self.with_drafts(state, out)

    def iteration(self, state: DecodeState, requests: Requests) -> DecodeState:
        """One iteration: verify (target pass, rejection sampling, commit), then draft."""
        state, verified = self.verify(state, requests)
        return self.draft(state, verified, requests)

    # ------------------------------------------------------------------ a run

    def requests(self, prompts, max_new_tokens, sampling, eos_token_id) -> tuple[list[torch.Tensor], Requests]:
        """Checked prompts and the per-request tensors on the target's device."""
        vocab = self.target.config.vocab_size
        prompts = checks.as_prompts(prompts, vocab, self.max_model_len)
        num_reqs = len(prompts)
        max_new = checks.check_max_new_tokens(max_new_tokens, num_reqs)
        eos = checks.check_eos(eos_token_id, num_reqs, vocab)
        temperature, seeds = checks.check_generation_sampling(sampling, num_reqs, self.proposer)
        truncation = checks.check_truncation(sampling, num_reqs)
        if truncation and not self.truncates:
            raise ValueError(f"sampling.{next(iter(truncation))}: {type(self).__name__} verifies without truncation "
                             "(top-k / top-p / min-p) for now")  # fmt: skip
        num_blocks = num_reqs * self.blocks_per_request
        if self.proposer is not None:
            checks.check_draft_capacity(self.proposer, num_blocks, num_reqs)
        self._ensure_target_caches(num_blocks)
        device = self.target_kv_caches[0].device
        limits = [min(m, self.max_model_len - p.shape[0]) for m, p in zip(max_new, prompts, strict=True)]
        requests = Requests(
            block_table=torch.arange(num_blocks, dtype=torch.int32).view(num_reqs, -1).to(device),
            limits=torch.tensor(limits, dtype=torch.int64, device=device),
            eos_token_ids=torch.tensor(eos, dtype=torch.int64, device=device),
            sampling=SamplingParams(
                temperature=temperature.to(device),
                seeds=seeds.to(device),
                **{name: t.to(device) for name, t in truncation.items()},
            ),  # fmt: skip
            all_greedy=bool((temperature == 0).all()),
            budget=None if self.budget is None else torch.tensor(self.budget, dtype=torch.int64, device=device),
        )
        return prompts, requests

    @torch.no_grad()
    def generate(
        self,
        prompts,
        *,
        max_new_tokens: int | list[int] = 32,
        sampling: SamplingParams | None = None,
        eos_token_id: int | list[int | None] | None = None,
        time_split: bool = False,
        progress: bool | str = False,
    ) -> GenerationResult:
        """Generate for every prompt until its EOS (included in its output), its
        max_new_tokens, or max_model_len total tokens. See `generate` for the arguments;
        progress: True (a bar labelled "generate") or the bar's label."""
        if isinstance(self.budget_policy, StepCosts):
            self.take_choice(self.choose_for_run(len(prompts)), len(prompts))
        prompts, requests = self.requests(prompts, max_new_tokens, sampling, eos_token_id)
        if hasattr(self.proposer, "reset_cache"):
            self.proposer.reset_cache()  # the multi-layer proposer's per-row shift cache
        clock, timings = Clock(requests.limits.device), Timings()
        start = clock()
        state = self.prefill(prompts, requests)
        flags = host_flags(state)
        trace = [flags[2:]]
        timings.prefill = clock() - start
        bar = progress_bar(progress, int(requests.limits.sum()), int(flags[1].sum()))
        if time_split:
            timings.verify, timings.draft = 0.0, 0.0
        graphs = captures_cuda_graphs(self.compile_options)
        max_iterations = int(requests.limits.max())  # each pass gives every running request >= 1 token
        decode_start = clock()
        while not bool(flags[0].all()) and timings.iterations < max_iterations:
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            if time_split:  # two calls, timed apart (two graphs instead of one)
                t0 = clock()
                state, verified = self.compiled["verify"](state, requests)
                t1 = clock()
                if self.k:
                    state = self.compiled["draft"](state, verified, requests)
                t2 = clock()
                timings.verify += t1 - t0
                timings.draft += t2 - t1
            else:
                state = self.compiled["iteration"](state, requests)
            if graphs:
                state = owned_copy(state)
            timings.iterations += 1
            before = int(flags[1].sum())
            flags = host_flags(state)
            trace.append(flags[2:])
            if bar is not None:
                bar.update(int(flags[1].sum()) - before)
        timings.decode = clock() - decode_start
        if bar is not None:
            bar.close()
        out = state.out_tokens.cpu()
        counts = flags[1].tolist()  # flags is host_flags' host copy: no device sync here
        tokens = [out[b, : counts[b]].clone() for b in range(len(counts))]
        stats = build_stats(state, timings, trace)
        if isinstance(self.budget_policy, StepCosts):
            self.learn_rates(stats)
        return GenerationResult(tokens, stats)


def target_num_kv_layers(target) -> int:
    return getattr(target, "num_kv_layers", target.config.num_layers)
