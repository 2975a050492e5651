"""Tiny random draft heads for the proposer tests (one helper, every test file)."""

import torch

from specdraft.models import DraftModelConfig, Eagle3Head, EagleHead, MTPHead

VOCAB, HIDDEN, TARGET_HIDDEN = 64, 32, 24


def draft_config(mrope: bool, **overrides) -> DraftModelConfig:
    fields = dict(
        hidden_size=HIDDEN,
        intermediate_size=48,
        num_heads=4,
        num_kv_heads=2,
        vocab_size=VOCAB,
        mrope_section=(2, 1, 1) if mrope else None,  # head_dim 8 -> 4 rotary frequencies
    )
    fields.update(overrides)
    return DraftModelConfig(**fields)


def make_head(method: str, mrope: bool = False, seed: int = 0, **overrides):
    """method: eagle | eagle3 | mtp. Returns (head, width of the target hidden states)."""
    torch.manual_seed(seed)
    if method == "eagle":
        return EagleHead(draft_config(mrope, **overrides)).eval(), HIDDEN
    if method == "eagle3":
        config = draft_config(mrope, draft_vocab_size=40, target_hidden_size=TARGET_HIDDEN, **overrides)
        head = Eagle3Head(config).eval()
        # Draft id d -> target id d + d2t[d]: a strictly increasing random subset.
        targets = torch.randperm(VOCAB)[:40].sort().values
        head.d2t.copy_(targets - torch.arange(40))
        head.t2d.zero_()[targets] = True
        return head, 3 * TARGET_HIDDEN
    if method == "mtp":
        return MTPHead(draft_config(mrope, **overrides)).eval(), HIDDEN
    raise ValueError(method)
