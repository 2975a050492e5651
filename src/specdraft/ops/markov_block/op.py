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
from .kernel import markov_bias_kernel, markov_last_token_kernel, markov_latent_kernel
from .reference import markov_block_sample_reference

MARKOV_KINDS = ("vanilla", "gated", "rnn")
MAX_RANK = 2048  # one W2 row is one register tile of the bias kernel
NUM_WARPS = 4

if TRITON_INTERPRET:
    # The interpreter emulates every lane in NumPy: small tiles keep it fast and make
    # small test vocabularies span several tiles, programs and combine blocks.
    TILE_ELEMENTS, PROGRAM_ELEMENTS, SPLIT_BLOCK = None, None, 4
else:
    TILE_ELEMENTS = 4096  # W2 elements per loop iteration of the bias kernel (32 a thread)
    # W2 elements per bias program: 128 KB of bf16, 256 rows (16 tiles of 16) at r = 256,
    # so a 152k vocabulary spreads over 594 programs, enough to stream W2 at B = 1.
    PROGRAM_ELEMENTS = 65536
    # Partials combined per iteration: a 152k row at r = 256 has 594, one iteration (every
    # program of the next step combines them, so their latency is on each step's path).
    SPLIT_BLOCK = 1024


def tiles(rank: int) -> tuple[int, int, int, int]:
    """(BLOCK_R, rows per tile, rows per program, latent entries per program) for rank r."""
    block_r = next_power_of_2(rank)
    if TRITON_INTERPRET:
        return block_r, 4, 8, 4
    rows_per_tile = max(1, TILE_ELEMENTS // block_r)
    return block_r, rows_per_tile, max(rows_per_tile, PROGRAM_ELEMENTS // block_r), rows_per_tile


def _outputs(num_reqs, num_steps, vocab, device):
    tokens = torch.empty((num_reqs, num_steps), dtype=torch.int32, device=device)
    return tokens, torch.empty((num_reqs, num_steps, vocab), dtype=torch.float32, device=device)


def _launch(base_logits, first_prev_tokens, markov_w1, markov_w2, temperature, seeds, positions, kind, hidden_part,
            latent_weight, salt):  # fmt: skip
    num_reqs, num_steps, vocab = base_logits.shape
    rank = int(markov_w1.shape[1])  # a model constant: specialised under torch.compile
    tokens, corrected = _outputs(num_reqs, num_steps, vocab, base_logits.device)
    if num_reqs == 0:
        return tokens, corrected
    block_r, rows_per_tile, rows_per_program, latent_rows = tiles(rank)
    num_splits = cdiv(vocab, rows_per_program)
    part_key = torch.empty((num_reqs, num_steps, num_splits), dtype=torch.float32, device=base_logits.device)
    part_idx = torch.empty((num_reqs, num_steps, num_splits), dtype=torch.int32, device=base_logits.device)
    gather = kind == "vanilla"
    latent = markov_w1 if gather else torch.empty((num_reqs, rank), dtype=torch.float32, device=base_logits.device)
    state = latent  # an unused pointer unless rnn
    if kind == "rnn":
        state = torch.empty((num_reqs, 2, rank), dtype=torch.float32, device=base_logits.device)
    for step in range(num_steps):
        if not gather:
            wrap_triton(markov_latent_kernel)[(num_reqs, cdiv(rank, latent_rows))](
                first_prev_tokens, markov_w1, hidden_part, latent_weight, state, latent, part_key, part_idx, tokens,
                step, vocab, rank, num_steps, num_splits, latent_weight.stride(0),
                RNN=kind == "rnn", LATENT_ROWS=latent_rows, BLOCK_R=block_r, EVEN_R=block_r == rank,
                SPLIT_BLOCK=SPLIT_BLOCK,
                num_warps=NUM_WARPS,
            )  # fmt: skip
        wrap_triton(markov_bias_kernel)[(num_reqs, num_splits)](
            base_logits, first_prev_tokens, markov_w1, markov_w2, latent, temperature, seeds, positions,
            tokens, corrected, part_key, part_idx,
            step, vocab, rank, num_steps, num_splits, base_logits.stride(0), base_logits.stride(1),
            SALT_KEY=salt_key(salt, STREAM_DRAFT), GATHER=gather, ROWS_PER_PROGRAM=rows_per_program,
            ROWS_PER_TILE=rows_per_tile, BLOCK_R=block_r, EVEN_R=block_r == rank, SPLIT_BLOCK=SPLIT_BLOCK,
            FAST_LOG2=FAST_LOG2,
            num_warps=NUM_WARPS,
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
