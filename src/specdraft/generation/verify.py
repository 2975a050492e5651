"""The target's side of an iteration: the batch layout of a verify pass (R query
tokens per request at positions lens .. lens + R - 1, slots from the block table),
the prompts' prefill layout, and sampling the target's tokens with the rejection
sampler (strict greedy at temperature 0, Leviathan otherwise).

Plain decoding and the prefill are verify passes with no drafts: the rejection
sampler with zero drafts emits the target's own token (argmax, or a Gumbel-max
sample keyed by the request's seed and the token's position), the same key the
speculative path uses for a bonus token.
"""

import torch

from specdraft.layout import BatchMetadata, TreeBatchMetadata
from specdraft.ops import rejection_sample, tree_ancestors, tree_positions, truncation_cut

from .state import Requests


def slots_of(positions: torch.Tensor, rows: torch.Tensor, block_table: torch.Tensor, block_size: int) -> torch.Tensor:
    """KV slot of each position of request rows[i] (int64). Positions past the table's
    reach are clamped onto its last block (never reached by a correct caller: the
    table covers max_model_len + K positions)."""
    block = (positions // block_size).clamp(max=block_table.shape[1] - 1)
    return block_table.long()[rows, block] * block_size + positions % block_size


def window_batch(lens: torch.Tensor, width: int, block_table: torch.Tensor, block_size: int, max_seq_len: int):
    """R = width query tokens per request at positions lens[b] + 0 .. R - 1.
    Returns (positions [B * R] int64, BatchMetadata). max_seq_len: a Python int bound
    (the block table's reach), so every pass has one static shape."""
    num_reqs = lens.shape[0]
    device = lens.device
    positions = lens[:, None] + torch.arange(width, device=device)[None, :]  # [B, R]
    rows = torch.arange(num_reqs, device=device)[:, None].expand(num_reqs, width)
    slots = slots_of(positions, rows, block_table, block_size)
    metadata = BatchMetadata(
        query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32, device=device) * width,
        seq_lens=(lens + width).to(torch.int32),
        block_table=block_table,
        slot_mapping=slots.reshape(-1),
        max_query_len=width,
        max_seq_len=max_seq_len,
    )
    return positions.reshape(-1), metadata


def tree_batch(lens, parents, depths, block_table: torch.Tensor, block_size: int, max_seq_len: int,
               max_model_len: int):  # fmt: skip
    """A verify pass over one tree of N nodes per request (parents, depths [B, N]):
    node i at sequence index lens[b] + i (its KV slot), at rotary position lens[b] +
    its depth (ops.tree_positions), seeing the prefix and its ancestors
    (ops.tree_ancestors). Returns (positions [B, N] int64, TreeBatchMetadata)."""
    num_reqs, n = parents.shape
    device = lens.device
    rows = torch.arange(num_reqs, device=device)[:, None].expand(-1, n)
    seq_index = lens[:, None] + torch.arange(n, device=device)
    metadata = TreeBatchMetadata(
        query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32, device=device) * n,
        seq_lens=(lens + n).to(torch.int32),
        block_table=block_table,
        slot_mapping=slots_of(seq_index, rows, block_table, block_size).reshape(-1),
        max_query_len=n,
        max_seq_len=max_seq_len,
        prefix_lens=lens,
        ancestors=tree_ancestors(parents),
    )
    return tree_positions(lens, depths.contiguous(), max_model_len), metadata


def prompt_batch(prompts: list[torch.Tensor], block_table: torch.Tensor, block_size: int, max_seq_len: int):
    """The prefill's packed layout of the prompts (built once, before any iteration).
    Returns (token ids [T] int32, positions [T] int64, BatchMetadata, last row of each
    prompt [B] int64)."""
    device = block_table.device
    lens = [int(p.shape[0]) for p in prompts]
    ids = torch.cat([p.to(torch.int32) for p in prompts]).to(device)
    positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in lens]).to(device)
    rows = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)).to(device)
    # Host lists on purpose: the prefill runs eagerly, once per generate, from Python
    # prompts (no device tensor is read back here; the compiled iterations never call it).
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    metadata = BatchMetadata(
        query_start_loc=cu,
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        block_table=block_table,
        slot_mapping=slots_of(positions, rows, block_table, block_size),
        max_query_len=max(lens),
        max_seq_len=max_seq_len,
    )
    return ids, positions, metadata, cu[1:].long() - 1


def sample_target(logits: torch.Tensor, drafts, draft_probs, requests: Requests, first_positions: torch.Tensor,
                  num_drafts: torch.Tensor | None = None):  # fmt: skip
    """Rejection-sample one verify pass. logits [B, K + 1, V]; drafts [B, K] (None:
    no drafts, logits [B, 1, V]: the target's own token); draft_probs [B, K, V] or
    None (one-hot drafts); first_positions [B]: the position of row 0's token to
    sample (the first draft's, or the one token's); num_drafts [B] int32: the drafts
    each request verifies (None: all K; a budgeted pass verifies fewer, and rows past
    them are never read). Returns (tokens [B, K + 1] int32, accepted counts [B]
    int32; [B, 1] and zeros without drafts when all greedy).

    An all-greedy batch (requests.all_greedy, a host-side bool) takes strict greedy
    directly: the rejection sampler's temperature-0 rule, without the noise and
    softmax its other rows need, which are most of what Inductor would otherwise
    generate and compile for an iteration."""
    if requests.all_greedy:
        return strict_greedy(logits, drafts, num_drafts)
    num_reqs = logits.shape[0]
    if drafts is None:
        # One dummy draft that is never read (zero drafts): row 0 emits, row 1 pads.
        drafts = torch.full((num_reqs, 1), -1, dtype=torch.int32, device=logits.device)
        num_drafts = torch.zeros(num_reqs, dtype=torch.int32, device=logits.device)
        logits = torch.cat([logits, torch.zeros_like(logits)], dim=1)
    elif num_drafts is None:
        num_drafts = torch.full((num_reqs,), drafts.shape[1], dtype=torch.int32, device=logits.device)
    sampling = requests.sampling
    logits = logits.contiguous()
    return rejection_sample(
        drafts.contiguous(),
        num_drafts,
        None if draft_probs is None else draft_probs.contiguous(),
        logits,
        sampling.temperature,
        sampling.seeds,
        first_positions.contiguous(),
        logit_cut=target_cut(logits, sampling),
    )


def target_cut(logits: torch.Tensor, sampling) -> torch.Tensor | None:
    """[B, R] fp32: the logit cut of every target row (logits [B, R, V]) for its
    request's top-k / top-p / min-p (ops.truncation_cut), or None without truncation."""
    num_reqs, rows = logits.shape[0], logits.shape[1]
    truncation = sampling.truncation_rows(rows)
    if truncation is None:
        return None
    temperature = sampling.temperature.repeat_interleave(rows)
    return truncation_cut(logits.view(num_reqs * rows, -1), temperature, *truncation).view(num_reqs, rows)


def strict_greedy(logits: torch.Tensor, drafts: torch.Tensor | None, num_drafts: torch.Tensor | None = None):
    """rejection_sample at temperature 0: accept draft j while it equals the target's
    argmax of row j (and j < num_drafts[b], when given); emit the argmax of the first
    row not accepted (the recovered or bonus token); -1 after it. logits [B, R, V],
    drafts [B, R - 1] or None (R = 1)."""
    return greedy_tokens(logits.argmax(dim=-1), drafts, num_drafts)


def greedy_tokens(target: torch.Tensor, drafts: torch.Tensor | None, num_drafts: torch.Tensor | None = None):
    """strict_greedy from the target's argmax per row, target [B, R] (a budgeted pass
    takes the argmax over its packed rows first, then gathers it per request)."""
    if drafts is None:
        return target.to(torch.int32), torch.zeros(target.shape[0], dtype=torch.int32, device=target.device)
    k = drafts.shape[1]
    match = drafts.long() == target[:, :k]
    if num_drafts is not None:
        match = match & (torch.arange(k, device=target.device)[None, :] < num_drafts[:, None])
    counts = match.long().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(k + 1, device=target.device)
    tokens = torch.where(rows[None, :] <= counts[:, None], target, -1)
    return tokens.to(torch.int32), counts.to(torch.int32)
