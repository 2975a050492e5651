"""`markov_block_sample`, the registered op, its public wrapper and checked mode's
value checker: CUDA tensors launch kernel.py's kernels, CPU tensors run
reference.py's torch."""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, between, check_choice, check_tensor_arg
from specdraft.value_checks import check_in_range

from ..backend import NAMESPACE, TRITON_INTERPRET, cdiv, next_power_of_2, use_triton
from ..common.fastmath import FAST_LOG2
from ..sampling.draft import check_draft_sample_values
from ..sampling.noise import STREAM_DRAFT, check_request_params, check_salt, salt_key
from .kernel import (
    SPLIT_BLOCK,
    markov_bias_kernel,
    markov_last_token_kernel,
    markov_latent_kernel,
    markov_tiles,
    rank_blocks,
    requests_per_program,
)
from .reference import markov_block_sample_reference

MARKOV_KINDS = ("vanilla", "gated", "rnn")
MAX_RANK = 2048  # one W1 row is one register vector of the latent kernel


def _outputs(num_reqs, num_steps, vocab, device):
    tokens = torch.empty((num_reqs, num_steps), dtype=torch.int32, device=device)
    return tokens, torch.empty((num_reqs, num_steps, vocab), dtype=torch.float32, device=device)


def _launch(base_logits, first_prev_tokens, markov_w1, markov_w2, temperature, seeds, positions, kind, hidden_part,
            latent_weight, salt):  # fmt: skip
    num_reqs, num_steps, vocab = base_logits.shape
    rank = int(markov_w1.shape[1])  # a model constant: specialised under torch.compile
    device = base_logits.device
    tokens, corrected = _outputs(num_reqs, num_steps, vocab, device)
    if num_reqs == 0:
        return tokens, corrected
    cfg = markov_tiles(rank, int(vocab))  # V too is a model constant
    block_b = requests_per_program(num_reqs, cfg.requests_per_program)
    # bf16 W2: the bias product on tensor cores, exact products (kernel.py); else fp32 FMAs.
    tensor_cores = markov_w2.dtype == torch.bfloat16
    gather = kind == "vanilla"
    pieces = 1 if gather and markov_w1.dtype == torch.bfloat16 else 3
    block_r, block_k = rank_blocks(rank, cfg.block_k if tensor_cores else cfg.fma_block_k)
    num_splits = cdiv(vocab, cfg.rows_per_program)
    part_key = torch.empty((num_reqs, num_steps, num_splits), dtype=torch.float32, device=device)
    part_idx = torch.empty((num_reqs, num_steps, num_splits), dtype=torch.int32, device=device)
    latent = markov_w1 if gather else torch.empty((num_reqs, rank), dtype=torch.float32, device=device)
    state = latent  # an unused pointer unless rnn
    if kind == "rnn":
        state = torch.empty((num_reqs, 2, rank), dtype=torch.float32, device=device)
    line = max(1, 128 // markov_w2.element_size())  # W2 elements per 128-byte line
    for step in range(num_steps):
        if not gather:
            wrap_triton(markov_latent_kernel)[(num_reqs, cdiv(rank, cfg.latent_rows))](
                first_prev_tokens, markov_w1, hidden_part, latent_weight, state, latent, part_key, part_idx, tokens,
                step, vocab, rank, num_steps, num_splits, latent_weight.stride(0),
                RNN=kind == "rnn", LATENT_ROWS=cfg.latent_rows, BLOCK_R=block_r, EVEN_R=block_r == rank,
                SPLIT_BLOCK=SPLIT_BLOCK,
                num_warps=cfg.latent_warps,
            )  # fmt: skip
        wrap_triton(markov_bias_kernel)[(cdiv(num_reqs, block_b), num_splits)](
            base_logits, first_prev_tokens, markov_w1, markov_w2, latent, temperature, seeds, positions,
            tokens, corrected, part_key, part_idx,
            step, num_reqs, vocab, rank, num_steps, num_splits, base_logits.stride(0), base_logits.stride(1),
            SALT_KEY=salt_key(salt, STREAM_DRAFT), GATHER=gather, BLOCK_B=block_b,
            ROWS_PER_PROGRAM=cfg.rows_per_program, ROWS_PER_TILE=cfg.rows_per_tile, BLOCK_K=block_k,
            BLOCK_R=block_r, EVEN_R=block_r == rank, TENSOR_CORES=tensor_cores, PIECES=pieces,
            EMULATE_BF16=TRITON_INTERPRET, PREFETCH_TILES=cfg.prefetch_tiles,
            LINES=next_power_of_2(cdiv(rank, line)), LINE=line, SPLIT_BLOCK=max(SPLIT_BLOCK, block_b),
            FAST_LOG2=FAST_LOG2,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
    wrap_triton(markov_last_token_kernel)[(num_reqs,)](
        part_key, part_idx, tokens, num_steps, num_splits, SPLIT_BLOCK=SPLIT_BLOCK
    )
    return tokens, corrected


@triton_op(f"{NAMESPACE}::markov_block_sample", mutates_args=())
def _markov_block_sample_op(
    base_logits: torch.Tensor,
    first_prev_tokens: torch.Tensor,
    markov_w1: torch.Tensor,
    markov_w2: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    kind: str,
    hidden_part: torch.Tensor | None,
    latent_weight: torch.Tensor | None,
    salt: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    args = (base_logits, first_prev_tokens, markov_w1, markov_w2, temperature, seeds, positions, kind, hidden_part,
            latent_weight, salt)  # fmt: skip
    if not use_triton(base_logits):
        return markov_block_sample_reference(*args)
    return _launch(*args)


@_markov_block_sample_op.register_fake
def _markov_block_sample_fake(base_logits, first_prev_tokens, markov_w1, markov_w2, temperature, seeds, positions,
                              kind, hidden_part, latent_weight, salt):  # fmt: skip
    return _outputs(*base_logits.shape, base_logits.device)


# ------------------------------------------------------------------ public wrapper


def markov_block_sample(
    base_logits: torch.Tensor,
    first_prev_tokens: torch.Tensor,
    markov_w1: torch.Tensor,
    markov_w2: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    kind: str = "vanilla",
    hidden_part: torch.Tensor | None = None,
    latent_weight: torch.Tensor | None = None,
    salt: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply a block drafter's Markov head over a drafted block and sample it, step by
    step, in one op (the package docstring gives the math and the weight split).

    No host sync; the S steps are one op (on CUDA, S + 1 kernel launches for vanilla,
    2S + 1 for gated and rnn).

    Args:
        base_logits: [B, S, V] fp32 / bf16 / fp16, the drafter's logits of the block;
            rows contiguous (stride 1 along V), any batch and step strides. S >= 1.
        first_prev_tokens: [B] int32/int64, the token before the block's first draft
            (the last accepted one), in [0, V); an id outside is a contract violation
            (checked mode refuses it), which the op clamps into [0, V).
        markov_w1: [V, r] fp32 / bf16 / fp16, contiguous: markov_w1.weight (the
            embedding of the previous token). r <= 2048.
        markov_w2: [V, r] fp32 / bf16 / fp16, contiguous: markov_w2.weight (Linear r -> V).
        temperature: [B] fp32, contiguous; <= 0 samples greedily.
        seeds: [B] int32/int64, contiguous; the noise's seed per request.
        positions: [B] int32/int64, contiguous: the token position of each request's
            first draft; step s's noise is keyed by positions[b] + s.
        kind: "vanilla", "gated" or "rnn".
        hidden_part: gated [B, S, r], rnn [B, S, 3r], fp32 / bf16 / fp16, contiguous;
            None for vanilla. The hidden states' part of the projection, bias included.
        latent_weight: gated [r, r], rnn [3r, 2r], fp32 / bf16 / fp16, rows contiguous
            (a column slice of the projection's weight is taken as it is); None for vanilla.
        salt: Python int in [0, 2**31 - 1], default 0; part of the noise's hash.

    Returns:
        (tokens [B, S] int32, corrected_logits [B, S, V] fp32): the sampled block and
        the logits each token was sampled from (base + Markov bias; not divided by T).
    """
    check_tensor_arg("base_logits", base_logits, FLOAT_DTYPES,
                     shape=(None, at_least(1, "S"), at_least(1, "V")), contiguous="rows")  # fmt: skip
    num_reqs, num_steps, vocab = base_logits.shape
    device = {"device_of": base_logits}
    check_tensor_arg("first_prev_tokens", first_prev_tokens, INDEX_DTYPES, shape=(num_reqs,), contiguous=True,
                     **device)  # fmt: skip
    check_tensor_arg("markov_w1", markov_w1, FLOAT_DTYPES, shape=(vocab, between(1, MAX_RANK, "r")), contiguous=True,
                     **device)  # fmt: skip
    rank = markov_w1.shape[1]
    check_tensor_arg("markov_w2", markov_w2, FLOAT_DTYPES, shape=(vocab, rank), contiguous=True, **device)
    check_request_params(num_reqs, temperature, seeds, positions, device_of=base_logits)
    check_choice("kind", kind, MARKOV_KINDS)
    _check_projection(kind, hidden_part, latent_weight, num_reqs, num_steps, rank, base_logits)
    check_salt(salt)
    if is_checked():
        check_markov_block_sample_values(first_prev_tokens, vocab, temperature, positions)
    tokens, corrected = _markov_block_sample_op(base_logits, first_prev_tokens, markov_w1, markov_w2, temperature,
                                                seeds, positions, kind, hidden_part, latent_weight, salt)  # fmt: skip
    return tokens, corrected


def _check_projection(kind, hidden_part, latent_weight, num_reqs, num_steps, rank, like) -> None:
    """hidden_part and latent_weight: None for vanilla, shaped for gated / rnn."""
    if kind == "vanilla":
        for name, value in (("hidden_part", hidden_part), ("latent_weight", latent_weight)):
            if value is not None:
                raise ValueError(f"{name} is only used by the gated and rnn kinds; pass None with kind='vanilla'")
        return
    for name, value in (("hidden_part", hidden_part), ("latent_weight", latent_weight)):
        if value is None:
            raise ValueError(f"{name} is required with kind={kind!r}")
    outputs, inputs = (rank, rank) if kind == "gated" else (3 * rank, 2 * rank)
    check_tensor_arg("hidden_part", hidden_part, FLOAT_DTYPES, shape=(num_reqs, num_steps, outputs), contiguous=True,
                     device_of=like)  # fmt: skip
    check_tensor_arg("latent_weight", latent_weight, FLOAT_DTYPES, shape=(outputs, inputs), contiguous="rows",
                     device_of=like)  # fmt: skip


# --------------------------------------------- checked mode's value checks (syncs)


def check_markov_block_sample_values(
    first_prev_tokens: torch.Tensor, vocab: int, temperature: torch.Tensor, positions: torch.Tensor
) -> None:
    """markov_block_sample: first_prev_tokens inside [0, V); temperature finite and
    >= 0; positions (the noise's counter) non-negative."""
    check_in_range("first_prev_tokens", first_prev_tokens, 0, vocab)
    check_draft_sample_values(temperature, positions=positions)
