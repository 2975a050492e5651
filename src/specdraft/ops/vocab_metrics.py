"""Vocabulary-wide metrics of a draft row against a target row, neither softmax
materialised: the op behind specdraft.training's draft metrics.

Per row n of draft logits [N, Vd] and target logits [N, V], at temperature
T = temperature[n] (scale s = T; s = 1 for a greedy row, T <= 0): q = softmax(draft / s)
over the draft vocabulary, p = softmax(target / s) over the whole target vocabulary.
Draft id i stands for target id i + d2t[i] (EAGLE-3's map, as
Eagle3Head.map_draft_to_target; without d2t, Vd == V and the map is the identity).
The map must be injective (EAGLE-3's are); an id it sends outside [0, V) has no mass.

Outputs, per row:
- draft_token: the target id of argmax(draft) (the lowest draft id on ties, as
  torch.argmax), int32; target_token: argmax(target), the lowest id on ties, int32;
- draft_lse, target_lse: logsumexp(draft / s), logsumexp(target / s) (natural log);
- accept: the expected acceptance sum_i min(q(i), p(i + d2t[i])); target mass outside
  the draft vocabulary never accepts. Greedy: p and q are one-hot, so accept is 1.0
  when draft_token == target_token, else 0.0;
- with divergence=True, cross_entropy = -sum_i pd(i) log q(i) and
  kl = sum_i pd(i) (log pd(i) - log q(i)), pd the target restricted to the draft
  vocabulary and renormalised (the usual EAGLE-3 training target), at the same s
  (1 for greedy rows). Terms with pd(i) = 0 count 0; pd(i) > 0 where q(i) = 0 makes
  both +inf. Without divergence both are empty ([0]).

A row of all -inf logits has no mass (lse -inf, no acceptance, argmax 0). With
target_is_probs, target holds probabilities: p = softmax(log(target) / s) (target
itself at s = 1), target_lse = logsumexp(log(target) / s).

The kernel (vocab_metrics_kernel.py): rows split into vocabulary chunks, worked
through as numbered items by a fixed set of programs, so that the second read of a
chunk (a sampled row needs both normalisers before sum_i min(p, q)) comes from L2. In
base 2, min(p, q) = 2**min(log2 p, log2 q): one exp2 per token pair. Extra memory: the
outputs, O(N), and a workspace of a few hundred KB whatever N.
"""

from typing import NamedTuple

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_bool, check_tensor_arg

from .backend import NAMESPACE, TRITON_INTERPRET, use_triton
from .common.fastmath import FAST_LOG2
from .vocab_metrics_kernel import INDICES, PARTIALS, STATS, vocab_metrics_kernel, work_plan

# The interpreter emulates every lane in NumPy: small blocks and chunks keep it fast and
# make small test vocabularies span several chunks, with a ring of few slots reused.
BLOCK_V = 16 if TRITON_INTERPRET else 2048
CHUNK_TOKENS = 2 * BLOCK_V if TRITON_INTERPRET else 8 * BLOCK_V
PROGRAMS_PER_SM = 2
NUM_WARPS = 8
# The reference's rows per chunk in eager mode: about 4M elements per fp32 temporary.
REFERENCE_CHUNK_ELEMENTS = 1 << 22


class VocabMetrics(NamedTuple):
    """Per-row outputs of `vocab_metrics` (see the module docstring)."""

    draft_token: torch.Tensor  # [N] int32, a target id
    target_token: torch.Tensor  # [N] int32
    draft_lse: torch.Tensor  # [N] fp32
    target_lse: torch.Tensor  # [N] fp32
    accept: torch.Tensor  # [N] fp32, sum_i min(p, q)
    cross_entropy: torch.Tensor  # [N] fp32, or [0] without divergence
    kl: torch.Tensor  # [N] fp32, or [0] without divergence


# ------------------------------------------------------------------------ reference


def _no_mass(lse: torch.Tensor) -> torch.Tensor:
    """The normaliser to subtract: +inf for an empty row (-inf lse), so its probabilities are 0, not NaN."""
    return torch.where(lse == float("-inf"), float("inf"), lse)


def _reference_rows(draft_logits, target, temperature, d2t, target_is_probs: bool, divergence: bool):
    greedy = ~(temperature > 0)  # T <= 0 (or NaN), as the kernel
    scale = torch.where(greedy, 1.0, temperature).float()[:, None]
    draft_x, target_x = draft_logits.float(), target.float()
    z_d = draft_x / scale
    z_t = (target_x.log() if target_is_probs else target_x) / scale
    draft_arg = draft_x.argmax(-1)
    target_token = target_x.argmax(-1)
    draft_lse = torch.logsumexp(z_d, -1)
    target_lse = torch.logsumexp(z_t, -1)
    if d2t is None:
        draft_token, z_t_on_draft = draft_arg, z_t
    else:
        ids = torch.arange(d2t.shape[0], device=d2t.device) + d2t.long()
        readable = (ids >= 0) & (ids < target.shape[-1])
        draft_token = ids[draft_arg]
        z_t_on_draft = torch.where(
            readable, z_t.gather(1, ids.clamp(0, target.shape[-1] - 1).expand_as(z_d)), -torch.inf
        )
    log_q = z_d - _no_mass(draft_lse)[:, None]
    log_p = z_t_on_draft - _no_mass(target_lse)[:, None]
    match = (draft_token == target_token).float()
    accept = torch.where(greedy, match, torch.exp(torch.minimum(log_p, log_q)).sum(-1))
    if divergence:
        lse_on_draft = target_lse if d2t is None else torch.logsumexp(z_t_on_draft, -1)
        log_pd = z_t_on_draft - _no_mass(lse_on_draft)[:, None]
        pd = log_pd.exp()
        cross_entropy = torch.where(pd > 0, -pd * log_q, 0.0).sum(-1)
        kl = torch.where(pd > 0, pd * (log_pd - log_q), 0.0).sum(-1)
    else:
        cross_entropy, kl = draft_lse.new_empty((0,)), draft_lse.new_empty((0,))  # distinct: outputs may not alias
    return (draft_token.to(torch.int32), target_token.to(torch.int32), draft_lse, target_lse, accept, cross_entropy, kl)


def vocab_metrics_reference(
    draft_logits, target, temperature, d2t, target_is_probs: bool, divergence: bool
) -> tuple[torch.Tensor, ...]:
    """The op in torch, vectorised over rows. On real (eager) tensors it goes through
    the rows in chunks, so its fp32 temporaries stay near REFERENCE_CHUNK_ELEMENTS
    elements whatever N; traced (torch.compile), it is one expression for Inductor to
    fuse, with no Python loop over a symbolic N."""
    rows = draft_logits.shape[0]
    chunk = max(1, REFERENCE_CHUNK_ELEMENTS // max(draft_logits.shape[1], target.shape[1]))
    eager = type(draft_logits) is torch.Tensor and not torch.compiler.is_compiling()
    if not eager or rows <= chunk:
        return _reference_rows(draft_logits, target, temperature, d2t, target_is_probs, divergence)
    parts = [
        _reference_rows(draft_logits[s : s + chunk], target[s : s + chunk], temperature[s : s + chunk], d2t,
                        target_is_probs, divergence)
        for s in range(0, rows, chunk)
    ]  # fmt: skip
    return tuple(torch.cat(column) for column in zip(*parts, strict=True))


# -------------------------------------------------------------------------- the op


def _outputs(rows, device, divergence: bool):
    tokens = [torch.empty((rows,), dtype=torch.int32, device=device) for _ in range(2)]
    floats = [torch.empty((rows,), dtype=torch.float32, device=device) for _ in range(3)]
    extra = [torch.empty((rows if divergence else 0,), dtype=torch.float32, device=device) for _ in range(2)]
    return (*tokens, *floats, *extra)


@triton_op(f"{NAMESPACE}::vocab_metrics", mutates_args=())
def _vocab_metrics_op(
    draft_logits: torch.Tensor,
    target: torch.Tensor,
    temperature: torch.Tensor,
    d2t: torch.Tensor | None,
    target_is_probs: bool,
    divergence: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not use_triton(draft_logits):
        return vocab_metrics_reference(draft_logits, target, temperature, d2t, target_is_probs, divergence)
    rows, draft_vocab = draft_logits.shape
    outs = _outputs(rows, draft_logits.device, divergence)
    if rows == 0:
        return outs
    draft_token, target_token, draft_lse, target_lse, accept, ce, kl = outs
    programs = _programs(draft_logits.device)
    vocab = target.shape[1]
    num_chunks, d_chunk, t_chunk, lag, ring = work_plan(rows, draft_vocab, vocab, programs, CHUNK_TOKENS, BLOCK_V)
    device = draft_logits.device
    stats = torch.empty((ring * num_chunks * STATS,), dtype=torch.float32, device=device)
    indices = torch.empty((ring * num_chunks * INDICES,), dtype=torch.int32, device=device)
    partials = torch.empty((ring * num_chunks * PARTIALS,), dtype=torch.float32, device=device)
    counters = torch.zeros((1 + 3 * ring,), dtype=torch.int32, device=device)  # the ticket, then 3 per slot
    wrap_triton(vocab_metrics_kernel)[(programs,)](
        draft_logits, target, temperature, draft_logits if d2t is None else d2t,
        draft_token, target_token, draft_lse, target_lse, accept,
        ce if divergence else accept, kl if divergence else accept,  # unused pointers without divergence
        stats, indices, partials, counters,
        rows, draft_vocab, vocab, draft_logits.stride(0), target.stride(0), temperature.stride(0),
        num_chunks, d_chunk, t_chunk, lag, ring,
        HAS_MAP=d2t is not None, PROBS=target_is_probs, DIVERGENCE=divergence, BLOCK=BLOCK_V,
        CHUNKS_PAD=1 << max(1, (num_chunks - 1).bit_length()), FAST=FAST_LOG2, num_warps=NUM_WARPS,
    )  # fmt: skip
    return outs


def _programs(device: torch.device) -> int:
    """Programs to launch: PROGRAMS_PER_SM per SM on CUDA; 2 in the interpreter, which
    runs them one after another (program 0 takes every item)."""
    if device.type != "cuda":
        return 2
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


@_vocab_metrics_op.register_fake
def _vocab_metrics_fake(draft_logits, target, temperature, d2t, target_is_probs, divergence):
    return _outputs(draft_logits.shape[0], draft_logits.device, divergence)


# ------------------------------------------------------------------ public wrapper


def vocab_metrics(
    draft_logits: torch.Tensor,
    target: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    *,
    d2t: torch.Tensor | None = None,
    target_is_probs: bool = False,
    divergence: bool = False,
) -> VocabMetrics:
    """Per-row draft/target metrics over the vocabulary in one kernel (module docstring).

    No host sync; under torch.compile the CPU path is the reference, fused by Inductor.

    Args:
        draft_logits: [N, Vd] fp32 / bf16 / fp16, rows contiguous, any row stride (rows of
            a wider buffer, or a [K, T, V] slice).
        target: [N, V] logits, or probabilities with target_is_probs; dtypes and strides as
            draft_logits.
        temperature: a Python number or a 0-dim fp32 tensor (all rows), or an fp32 tensor
            [N] (one per row, any stride); T <= 0 is greedy.
        d2t: [Vd] int32/int64, or None (requires Vd == V). Draft id i is target id i + d2t[i].
        target_is_probs: bool. target holds probabilities, not logits.
        divergence: bool. Also the cross-entropy and KL per row.

    Returns:
        VocabMetrics: draft_token, target_token [N] int32 (target ids); draft_lse,
        target_lse, accept [N] fp32; cross_entropy, kl [N] fp32 ([0] without divergence).
    """
    check_tensor_arg("draft_logits", draft_logits, FLOAT_DTYPES, shape=(None, at_least(1, "Vd")), contiguous="rows")
    rows, draft_vocab = draft_logits.shape
    check_tensor_arg(
        "target", target, FLOAT_DTYPES, shape=(rows, at_least(1, "V")), contiguous="rows", device_of=draft_logits
    )
    check_tensor_arg(
        "d2t", d2t, INDEX_DTYPES, shape=(draft_vocab,), contiguous=True, device_of=draft_logits, optional=True
    )
    if d2t is None and draft_vocab != target.shape[1]:
        raise ValueError(
            f"d2t is required when the draft vocabulary ({draft_vocab}) differs from the target's ({target.shape[1]})"
        )
    check_bool("target_is_probs", target_is_probs)
    check_bool("divergence", divergence)
    temperature = _row_temperatures(temperature, rows, draft_logits)
    return VocabMetrics(*_vocab_metrics_op(draft_logits, target, temperature, d2t, target_is_probs, divergence))


def _row_temperatures(temperature, rows, like: torch.Tensor) -> torch.Tensor:
    """temperature as an fp32 tensor [rows]; one value for all rows is expanded (stride 0), not copied."""
    if isinstance(temperature, bool) or not isinstance(temperature, int | float | torch.Tensor):
        raise ValueError(f"temperature must be a number or an fp32 tensor, got {type(temperature).__name__}")
    if not isinstance(temperature, torch.Tensor):
        return torch.full((1,), float(temperature), dtype=torch.float32, device=like.device).expand(rows)
    check_tensor_arg("temperature", temperature, torch.float32, shape=[(), (rows,)], device_of=like)
    return temperature.expand(rows)
