"""What a batch of requests carries from one iteration to the next, and the
bookkeeping that commits what one verify pass emitted: tensors in, tensors out,
static shapes, no host sync.

A request's sequence is its prompt (P tokens) then its generated tokens. Between
iterations the newest token (`last_tokens`) is not yet in the target's KV cache; it
sits at position `lens` = P + num_generated - 1, which is also the number of tokens
the target's cache holds for the request. The next verify pass feeds
[last token, K drafts] at positions lens .. lens + K. A finished request keeps
running as padding on a frozen state (same window every pass), so its outputs stop
while no shape changes.
"""

import dataclasses
from dataclasses import dataclass

import torch

from specdraft.config import SamplingParams


@dataclass
class Requests:
    """What stays fixed for a batch during a run (device tensors, [B] unless noted).

    block_table [B, blocks_per_request] int32: the request's KV blocks, the same
    block ids in the target's caches and the draft's. limits int64: tokens the
    request may generate (min(max_new_tokens, max_model_len - prompt length)).
    eos_token_ids int64: the request's EOS id, or -1 for none. sampling:
    temperature (0 = greedy) and seeds, for the target's sampling and the draft's.
    all_greedy: every temperature is 0, known on the host before the run. A Python
    bool, so a compiled iteration specialises on it (at most two graphs: greedy
    batches verify with an argmax, mixed ones with the full rejection sampler).
    budget: 0-dim int64, the drafts verified per iteration over the batch (a budgeted
    decoder's; None otherwise).
    """

    block_table: torch.Tensor
    limits: torch.Tensor
    eos_token_ids: torch.Tensor
    sampling: SamplingParams
    all_greedy: bool = False
    budget: torch.Tensor | None = None

    @property
    def num_reqs(self) -> int:
        return self.limits.shape[0]


@dataclass
class DecodeState:
    """The batch between two iterations (a dataclass, not a NamedTuple: torch 2.11's
    Dynamo rebuilt a NamedTuple made by _replace inside a compiled call with fields missing).

    last_tokens [B] int32: each request's newest token, not yet in the target's cache.
    lens [B] int64: its position (= tokens in the target's cache).
    drafts [B, K] int32 and draft_probs [B, K, V] fp32 or None: the next pass's drafts
        (K = 0 for plain decoding).
    num_generated [B] int64: tokens emitted so far (out_tokens[b, :num_generated[b]]).
    done [B] bool: finished (EOS emitted, limit reached); its row no longer changes.
    out_tokens [B, W] int32: generated tokens, -1 past num_generated.
    accepted [K] int64: statistics, how many times draft k (0-based) was accepted,
        summed over the passes in which the request was running.
    passes [B] int64: statistics, verify passes in which each request was running.
    verified [B] int64: statistics, drafts each request had verified, summed over the
        passes in which it was running (K per pass, fewer under a budget).
    tested [K] int64: statistics, how many times draft k was tested by the rejection
        sampler (verified with every draft before it accepted), so accepted / tested
        is its conditional acceptance rate whatever the budget verified.
    accepted_drafts [B] int64: statistics, drafts each request had accepted, summed
        likewise (before any cut at EOS or its limit, as `accepted`).
    survival [B, K] fp32 or None: the survival estimate of each draft (budgeted
        verification, generation/budget.py; None without a budget).
    calibration [2, K] fp32 or None: the running acceptance rates that calibrate
        them (budget.calibrated; None without the decoder's calibration).
    """

    last_tokens: torch.Tensor
    lens: torch.Tensor
    drafts: torch.Tensor
    draft_probs: torch.Tensor | None
    num_generated: torch.Tensor
    done: torch.Tensor
    out_tokens: torch.Tensor
    accepted: torch.Tensor
    passes: torch.Tensor
    verified: torch.Tensor
    tested: torch.Tensor
    accepted_drafts: torch.Tensor
    survival: torch.Tensor | None
    calibration: torch.Tensor | None = None


def captures_cuda_graphs(compile_options: dict | None) -> bool:
    """Whether torch.compile options record CUDA graphs: mode "reduce-overhead" or
    "max-autotune", or Inductor's own option "triton.cudagraphs" (what those modes
    set; demo.compile_options passes it with other options, which torch.compile
    does not take beside a mode)."""
    options = compile_options or {}
    return options.get("mode") in ("reduce-overhead", "max-autotune") or bool(
        (options.get("options") or {}).get("triton.cudagraphs")
    )


def owned_copy(state: DecodeState) -> DecodeState:
    """The state with every tensor copied out of a CUDA graph's memory pool.

    Under CUDA graphs (mode="reduce-overhead") an iteration's outputs live in memory that the next
    replay overwrites; fed back as the next iteration's inputs they would be read
    after being written (torch refuses that). One copy of the state per iteration
    (kilobytes, plus draft_probs [B, K, V] with probabilistic drafts), outside the
    graph."""
    fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    return type(state)(**{name: None if t is None else t.clone() for name, t in fields.items()})


def initial_state(first_tokens, prompt_lens, requests: Requests, num_speculative_tokens: int, width: int):
    """The state after the prefill sampled each request's first token (drafts empty,
    to be filled by the draft's prefill)."""
    num_reqs = first_tokens.shape[0]
    device = first_tokens.device
    first = first_tokens.to(torch.int32).contiguous()
    out = torch.full((num_reqs, width), -1, dtype=torch.int32, device=device)
    out[:, 0] = first
    num_generated = torch.ones(num_reqs, dtype=torch.int64, device=device)
    done = (first.long() == requests.eos_token_ids) | (num_generated >= requests.limits)
    return DecodeState(
        last_tokens=first,
        lens=prompt_lens.to(torch.int64),
        drafts=torch.zeros(num_reqs, num_speculative_tokens, dtype=torch.int32, device=device),
        draft_probs=None,
        num_generated=num_generated,
        done=done,
        out_tokens=out,
        accepted=torch.zeros(num_speculative_tokens, dtype=torch.int64, device=device),
        passes=torch.zeros(num_reqs, dtype=torch.int64, device=device),
        verified=torch.zeros(num_reqs, dtype=torch.int64, device=device),
        tested=torch.zeros(num_speculative_tokens, dtype=torch.int64, device=device),
        accepted_drafts=torch.zeros(num_reqs, dtype=torch.int64, device=device),
        survival=None,
    )


def tested_and_accepted(done: torch.Tensor, counts: torch.Tensor, k: int,
                        num_verified: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """[B, k] bool each, for one verify pass: draft j of request r was tested if r was
    running, verified it (num_verified [B]; None: all k) and accepted every draft
    before it (counts [B]: drafts accepted); it was accepted if counts > j."""
    steps = torch.arange(k, device=counts.device)[None, :]
    running = (~done)[:, None]
    accepted = running & (counts.long()[:, None] > steps)
    tested = running & (counts.long()[:, None] >= steps)
    if num_verified is not None:
        tested = tested & (steps < num_verified.long()[:, None])
    return tested, accepted


def commit(state: DecodeState, tokens: torch.Tensor, counts: torch.Tensor, requests: Requests,
           num_verified: torch.Tensor | None = None) -> DecodeState:  # fmt: skip
    """Take what a verify pass emitted into the state (drafts left as they were).

    tokens [B, R] int32 (the rejection sampler's: accepted drafts, the emitted token,
    then -1), counts [B] accepted drafts, num_verified [B] the drafts each request
    verified (None: every one of state.drafts). A running request emits counts + 1 tokens,
    cut after its EOS and at its limit; it finishes when either cut applies. Finished
    rows keep their state: their window, position and outputs stay as they were.
    """
    num_cols = tokens.shape[1]
    active = ~state.done
    j = torch.arange(num_cols, device=tokens.device)
    emitted = counts.long() + 1  # accepted drafts + the recovered / bonus token
    is_eos = (tokens.long() == requests.eos_token_ids[:, None]) & (j[None, :] < emitted[:, None])
    first_eos = torch.where(is_eos, j[None, :], num_cols).amin(dim=1)  # num_cols: none
    room = requests.limits - state.num_generated
    keep = torch.minimum(torch.minimum(emitted, first_eos + 1), room)
    keep = torch.where(active, keep, 0)

    # out[b, n_b + j] = tokens[b, j] for j < keep[b]; every other cell rewritten with
    # its own value. Columns stay below the width: n_b + j < limit + R <= W.
    width = state.out_tokens.shape[1]
    cols = (state.num_generated[:, None] + j[None, :]).clamp(max=width - 1)
    old = state.out_tokens.gather(1, cols)
    new = torch.where(j[None, :] < keep[:, None], tokens.to(state.out_tokens.dtype), old)
    out_tokens = state.out_tokens.scatter(1, cols, new)

    num_generated = state.num_generated + keep
    newest = tokens.gather(1, (keep - 1).clamp(min=0)[:, None])[:, 0]
    last_tokens = torch.where(keep > 0, newest.to(state.last_tokens.dtype), state.last_tokens)
    # Only a request that finishes here can keep fewer than it emitted, so the
    # positions of running requests advance by exactly what the target verified.
    lens = state.lens + keep
    done = state.done | (first_eos < keep) | (num_generated >= requests.limits)

    tested_now, accepted_now = tested_and_accepted(state.done, counts, state.accepted.shape[0], num_verified)
    verified_now = state.drafts.shape[1] if num_verified is None else num_verified.long()
    return dataclasses.replace(
        state,
        last_tokens=last_tokens,
        lens=lens,
        num_generated=num_generated,
        done=done,
        out_tokens=out_tokens,
        accepted=state.accepted + accepted_now.sum(dim=0),
        passes=state.passes + active.long(),
        verified=state.verified + torch.where(active, verified_now, 0),
        tested=state.tested + tested_now.sum(dim=0),
        accepted_drafts=state.accepted_drafts + torch.where(active, counts.long(), 0),
    )
