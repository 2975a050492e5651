"""Build complete `propose()` inputs for tests: a batch of requests whose windows
are prefills (positions 0 .. n-1) or continuations, distinct KV blocks per request,
random target hidden states, 1-D or M-RoPE positions, per-request sampling."""

from dataclasses import dataclass

import torch

from specdraft.config import BatchMetadata, SamplingParams


@dataclass
class DraftBatch:
    target_token_ids: torch.Tensor  # [T] int32
    target_positions: torch.Tensor  # [T] or [3, T] int64
    target_hidden_states: torch.Tensor  # [T, H_target]
    next_token_ids: torch.Tensor  # [B] int32
    metadata: BatchMetadata
    sampling: SamplingParams
    start_positions: list[int]  # first position of each window (plain ints, for oracles)

    def propose_args(self) -> tuple:
        return (
            self.target_token_ids,
            self.target_positions,
            self.target_hidden_states,
            self.next_token_ids,
            self.metadata,
            self.sampling,
        )


def make_draft_batch(
    query_lens: list[int],
    *,
    vocab_size: int,
    target_hidden_size: int,
    block_size: int,
    blocks_per_request: int,
    start_positions: list[int] | None = None,
    mrope: bool = False,
    temperatures: list[float] | None = None,
    seed: int = 0,
    device="cpu",
    dtype=torch.float32,
) -> DraftBatch:
    """Request b's window: query_lens[b] tokens at positions start_positions[b] + i
    (default 0: a prefill). Its blocks are a random disjoint set of the
    B * blocks_per_request blocks of the cache; seq_len = start + query_len.
    M-RoPE positions: row 0 = the text position, rows 1 and 2 offset (as for image
    tokens), so code that confuses rows is caught."""
    gen = torch.Generator().manual_seed(seed)
    num_reqs = len(query_lens)
    starts = list(start_positions) if start_positions is not None else [0] * num_reqs
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)
    num_tokens = qsl[-1]
    positions = torch.tensor([starts[b] + i for b, n in enumerate(query_lens) for i in range(n)], dtype=torch.int64)
    req_of_token = torch.tensor([b for b, n in enumerate(query_lens) for _ in range(n)], dtype=torch.int64)
    block_table = torch.randperm(num_reqs * blocks_per_request, generator=gen).view(num_reqs, blocks_per_request)
    block = (positions // block_size).clamp(max=blocks_per_request - 1)
    slot_mapping = block_table[req_of_token, block] * block_size + positions % block_size
    seq_lens = [s + n for s, n in zip(starts, query_lens, strict=True)]
    if mrope:
        positions = torch.stack([positions, positions + 3, positions * 2])
    temps = temperatures if temperatures is not None else [0.0] * num_reqs
    metadata = BatchMetadata(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=block_table.to(torch.int32).to(device),
        slot_mapping=slot_mapping.to(device),
        max_query_len=max(query_lens, default=1),
        max_seq_len=blocks_per_request * block_size,
    )
    return DraftBatch(
        target_token_ids=torch.randint(0, vocab_size, (num_tokens,), generator=gen, dtype=torch.int32).to(device),
        target_positions=positions.to(device),
        target_hidden_states=torch.randn(num_tokens, target_hidden_size, generator=gen).to(dtype).to(device),
        next_token_ids=torch.randint(0, vocab_size, (num_reqs,), generator=gen, dtype=torch.int32).to(device),
        metadata=metadata,
        sampling=SamplingParams(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            seeds=torch.randint(0, 2**40, (num_reqs,), generator=gen).to(device),
        ),
        start_positions=starts,
    )
