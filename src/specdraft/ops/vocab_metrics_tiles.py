"""The tiles `vocab_metrics` (vocab_metrics.py) reads: a block of draft ids, the draft
row's logits there and the target's values at the target ids they stand for (through
EAGLE-3's d2t map, or the same ids without one), and the target's values in base 2
(logits, or probabilities through log2).

Jit functions are imported by name: Inductor re-emits a user Triton kernel with the
jit functions it calls, and a module attribute is not carried along.
"""

from .backend import tl, triton


@triton.jit
def target_ids(d2t_ptr, idx, in_draft, vocab, HAS_MAP: tl.constexpr):
    """(target ids of draft ids idx, where they may be read)."""
    if HAS_MAP:
        ids = idx + tl.load(d2t_ptr + idx, mask=in_draft, other=0).to(tl.int64)
        return ids, in_draft & (ids >= 0) & (ids < vocab)
    else:
        return idx, in_draft


@triton.jit
def load_target(row_ptr, ids, mask, PROBS: tl.constexpr):
    """Raw target values: logits (-inf where masked) or probabilities (0 there)."""
    if PROBS:
        return tl.load(row_ptr + ids, mask=mask, other=0.0)
    else:
        return tl.load(row_ptr + ids, mask=mask, other=float("-inf"))


@triton.jit
def draft_tile(draft_row, target_row, d2t_ptr, idx, draft_vocab, vocab, WITH_TARGET: tl.constexpr,
               HAS_MAP: tl.constexpr, PROBS: tl.constexpr):  # fmt: skip
    """Raw values of the draft ids idx (-inf outside [0, Vd)) and, WITH_TARGET, of the
    target at their target ids (else the draft values again)."""
    in_draft = (idx >= 0) & (idx < draft_vocab)
    x = tl.load(draft_row + idx, mask=in_draft, other=float("-inf"))
    if WITH_TARGET:
        ids, readable = target_ids(d2t_ptr, idx, in_draft, vocab, HAS_MAP)
        return x, load_target(target_row, ids, readable, PROBS)
    else:
        return x, x


@triton.jit
def target_log2(x, gain, PROBS: tl.constexpr):
    """log2 of the unnormalised tempered target: logits * log2(e) / s, or log2(probs) / s."""
    if PROBS:
        return tl.log2(x) * gain
    else:
        return x * gain
