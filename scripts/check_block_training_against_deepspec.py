"""Check specdraft.training.block against DeepSpec's own training code, once, outside
CI (the tests check it against plain loops of the same formulas instead):

    git clone https://github.com/deepseek-ai/DeepSpec /tmp/DeepSpec
    PYTHONPATH=src:tests python scripts/check_block_training_against_deepspec.py /tmp/DeepSpec

On one padded sample (DeepSpec's [1, L] batch is one packed sequence here), for
anchors drawn by DeepSpec's sample_anchor_positions: the anchor candidates
(build_anchor_candidate_mask), the labels and eval_mask (build_eval_mask), the
attention rule (create_dspark_attention_mask's mask_mod at every pair), the aligned
target logits, and the loss (compute_dspark_loss, one gloo process) under DFlash's,
DSpark's and a third set of weights must agree exactly. DeepSpec's common.py and
loss.py are loaded by path with its metrics logger stubbed out (its package imports
need transformers and its training stack; these two files need only torch).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

from specdraft.training import (
    DFLASH_LOSS,
    DSPARK_LOSS,
    BlockLossWeights,
    aligned_target_logits,
    anchor_candidates,
    block_forward,
    block_labels,
    block_loss,
)
from specdraft.training.block_attention import context_visible

from fixtures.block_heads import make_block_head  # tests/ on PYTHONPATH


def load_deepspec(root: Path):
    """DeepSpec's modeling/dspark/common.py and loss.py as modules."""
    for name in ("deepspec", "deepspec.utils", "deepspec.modeling", "deepspec.modeling.dspark"):
        package = types.ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package
    metrics = types.ModuleType("deepspec.utils.metrics")
    metrics.add_metric = lambda *args, **kwargs: None
    sys.modules["deepspec.utils.metrics"] = metrics

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    folder = root / "deepspec" / "modeling" / "dspark"
    return load("deepspec.modeling.dspark.common", folder / "common.py"), load(
        "deepspec.modeling.dspark.loss", folder / "loss.py"
    )


def check(common, loss_module, seeds: int = 5) -> float:
    torch.manual_seed(0)
    length, size, num_anchors = 40, 5, 12
    head = make_block_head(True, "gated", True, True, block_size=size)
    vocab = head.config.vocab_size
    ids = torch.randint(0, vocab - 1, (1, length))
    token_mask = (torch.rand(1, length) > 0.2).float()  # DeepSpec's loss_mask: over tokens
    token_mask[0, :3] = 0
    row_mask = torch.cat([token_mask[0, 1:], torch.zeros(1)]) > 0.5  # specdraft's: row j scores token j + 1
    features = torch.randn(length, head.hidden_width)
    target_logits = 3 * torch.randn(length, vocab)
    cu = torch.tensor([0, length])

    deepspec_candidates = common.build_anchor_candidate_mask(seq_len=length, loss_mask=token_mask)[0]
    candidates = anchor_candidates(cu, length, row_mask)
    assert torch.equal(deepspec_candidates, candidates[: length - 1]) and not candidates[-1], "anchor candidates"

    worst = 0.0
    for seed in range(seeds):
        torch.manual_seed(seed)
        anchors, keep = common.sample_anchor_positions(seq_len=length, loss_mask=token_mask, num_anchors=num_anchors,
                                                       device="cpu")  # fmt: skip
        labels = block_labels(ids[0], cu, anchors[0], keep[0], block_size=size, loss_mask=row_mask)
        label_rows = anchors.unsqueeze(-1) + torch.arange(1, size + 1).view(1, 1, -1)
        safe = torch.where(keep.unsqueeze(-1), label_rows.clamp(max=length - 1), 0)
        eval_mask = common.build_eval_mask(seq_len=length, loss_mask=token_mask, label_indices=label_rows,
                                           safe_label_indices=safe, block_keep_mask=keep)  # fmt: skip
        assert torch.equal(eval_mask[0], labels.eval_mask), f"eval_mask, seed {seed}"
        target_ids = torch.gather(ids.unsqueeze(1).expand(-1, num_anchors, -1), 2, safe)
        assert torch.equal(target_ids[0][labels.eval_mask], labels.target_ids[labels.eval_mask]), "target ids"

        block_mask = common.create_dspark_attention_mask(anchor_positions=anchors, block_keep_mask=keep,
                                                         seq_len=length, block_size=size, device="cpu")  # fmt: skip
        q, kv = torch.arange(num_anchors * size)[:, None], torch.arange(length + num_anchors * size)[None, :]
        deepspec_rule = block_mask.mask_mod(torch.zeros((), dtype=torch.long), None, q, kv)
        context = context_visible(torch.zeros(length, dtype=torch.long), anchors[0], keep[0]).repeat_interleave(size, 0)
        own = torch.block_diag(*[torch.ones(size, size, dtype=torch.bool)] * num_anchors)
        own = own & keep[0].repeat_interleave(size)[:, None]
        assert torch.equal(deepspec_rule, torch.cat([context, own], 1)), f"attention rule, seed {seed}"

        with torch.no_grad():
            out = block_forward(head, ids[0], features, torch.arange(length), cu, anchors[0], keep[0])
        aligned = aligned_target_logits(target_logits, labels)
        deepspec_aligned = target_logits[(safe - 1).clamp(min=0)]
        assert torch.equal(deepspec_aligned[0][labels.eval_mask], aligned[labels.eval_mask]), "aligned target logits"
        for weights in (DFLASH_LOSS, DSPARK_LOSS, BlockLossWeights(None, 0.3, 0.5, 0.2)):
            confidence = out.confidence if weights.confidence > 0 else None
            outputs = common.DSparkForwardOutput(
                draft_logits=out.logits[None], target_ids=target_ids, eval_mask=eval_mask, block_keep_mask=keep,
                confidence_pred=None if confidence is None else confidence[None], aligned_target_logits=deepspec_aligned,
            )  # fmt: skip
            want = loss_module.compute_dspark_loss(outputs=outputs, loss_decay_gamma=weights.loss_decay_gamma,
                                                   ce_loss_alpha=weights.ce, l1_loss_alpha=weights.l1,
                                                   confidence_head_alpha=weights.confidence)  # fmt: skip
            got = block_loss(out.logits, labels, target_logits=aligned, confidence=confidence, weights=weights).loss
            worst = max(worst, abs(got.item() - want.item()))
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("deepspec", type=Path, help="a checkout of github.com/deepseek-ai/DeepSpec")
    args = parser.parse_args()
    common, loss_module = load_deepspec(args.deepspec)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)  # compute_dspark_loss all-reduces its denominators
    try:
        worst = check(common, loss_module)
    finally:
        dist.destroy_process_group()
    print(f"anchor candidates, labels, eval_mask, attention rule: equal; loss: max |specdraft - DeepSpec| = {worst}")
    return 0 if worst <= 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
