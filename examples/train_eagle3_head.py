"""Train an EAGLE-3 head on the shipped demo target for a few hundred steps on the CPU,
evaluating it compiled every N steps, and plot its acceptance length over training.

The target is the demo pair's (specdraft.assets: a 4-layer, width-256 byte-level
Llama), frozen. The head is a fresh Eagle3Head with the shipped head's config,
initialised from --seed as scripts/train_demo_pair.py does (its lm_head and final
norm start from the target's), sharing the target's frozen embedding; so the curve
starts near zero acceptance.

Each training step samples byte windows of the stdlib files the demo pair was
trained on (training.json's train_files), runs the target over them
(capture_target_outputs), unrolls the head K steps with teacher forcing
(specdraft.training.unroll) and distils the target: step k at row t learns
softmax(target_logits[t + k + 1]) (soft cross-entropy, step k weighted 0.8 ** k as
in scripts/train_demo_pair.py). Every --eval-every steps a compiled
DraftEvaluator scores the head's own greedy drafts on windows of the held-out files
(captured once) and records the exact greedy acceptance length (accepted drafts per
verification, per start) and SpecForge's product of per-step accuracies. The first
evaluation holds the evaluator's compile (dynamic shapes: one graph for the run).

    python examples/train_eagle3_head.py                      # ~300 steps, a few minutes

Outputs under --out: acceptance.png (the curve), log.json (settings, losses, every
evaluation), head/ (the trained head, without the embedding it shares) and, with
--save-eval-data, eval_data/ (the held-out batch: python -m specdraft.eval OUT/head
OUT/eval_data --target src/specdraft/assets/demo_pair/target repeats the last evaluation).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from specdraft.assets import DEMO_PAIR, demo_files, demo_held_out_files, load_demo_pair
from specdraft.capture import read_text_bytes
from specdraft.models import Eagle3Head, default_aux_layers, load_draft_model, save_draft_model
from specdraft.training import (
    DraftEvaluator,
    TargetBatch,
    capture_target_outputs,
    evaluate,
    finalize,
    format_table,
    plot_training_curve,
    save_batch,
    unroll,
)

STEP_WEIGHT = 0.8  # step k's loss weighs STEP_WEIGHT ** k: later steps, harder to learn, count less

# ------------------------------------------------------------------------ data


def sample_windows(data: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> list[torch.Tensor]:
    starts = torch.randint(0, data.numel() - length, (batch,), generator=gen)
    return list(data[starts[:, None] + torch.arange(length)].long())


def spread_windows(data: torch.Tensor, count: int, length: int) -> list[torch.Tensor]:
    """`count` windows evenly spaced over the data (every held-out file gets some)."""
    starts = torch.linspace(0, data.numel() - length, count).long()
    return list(data[starts[:, None] + torch.arange(length)].long())


def capture(target: torch.nn.Module, windows: list[torch.Tensor]) -> TargetBatch:
    """The frozen target's outputs: aux hidden states for the head, logits to distil."""
    device = target.embed_tokens.weight.device
    return capture_target_outputs(target, [w.to(device) for w in windows], aux_layers=default_aux_layers(4))


# ------------------------------------------------------------------------ models


def frozen_target(device: str) -> torch.nn.Module:
    target, _ = load_demo_pair(device=device)
    return target.eval().requires_grad_(False)


def fresh_head(target: torch.nn.Module, seed: int, device: str) -> Eagle3Head:
    """The shipped head's architecture with new weights: N(0, 0.02) (the midlayer's
    output projections / sqrt(2)), norms 1, lm_head and final norm copied from the
    target, embedding shared with the target (frozen)."""
    head = load_draft_model(DEMO_PAIR / "eagle3", method="eagle3", device=device)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(head.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=gen) * std)
        head.lm_head.weight.copy_(target.lm_head.weight)
        head.norm.weight.copy_(target.norm.weight)
    head.share_from(target)
    return head


def trainable_parameters(head: Eagle3Head) -> list[torch.nn.Parameter]:
    # The shared embedding is the target's: frozen with it.
    return [p for p in head.parameters() if p.requires_grad]


# ------------------------------------------------------------------------ training


def distill_loss(head: Eagle3Head, batch: TargetBatch, num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted soft cross-entropy, per-step loss [K]) of the teacher-forced unroll
    against the target's distribution at row t + k + 1 (valid entries only)."""
    out = unroll(head, *batch.unroll_args(), num_steps=num_steps, tokens="data")
    rows = torch.arange(batch.num_tokens, device=batch.token_ids.device)
    offsets = torch.arange(1, num_steps + 1, device=rows.device)[:, None]
    # Invalid entries (past the sequence's end) read a clamped row and are masked out.
    wanted = F.softmax(batch.target_logits.float(), -1)[(rows + offsets).clamp(max=batch.num_tokens - 1)]
    cross_entropy = -(wanted * F.log_softmax(out.logits.float(), -1)).sum(-1)  # [K, T]
    valid = out.valid.float()
    per_step = (cross_entropy * valid).sum(-1) / valid.sum(-1).clamp(min=1)
    weights = STEP_WEIGHT ** torch.arange(num_steps, device=rows.device, dtype=per_step.dtype)
    return (weights * per_step).sum(), per_step.detach()


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def train_step(head, target, opt, loss_fn, windows, args, step) -> torch.Tensor:
    for group in opt.param_groups:
        group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
    batch = capture(target, windows)
    loss, per_step = loss_fn(head, batch, args.draft_steps)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable_parameters(head), 1.0)
    opt.step()
    return per_step


# ------------------------------------------------------------------------ evaluation


def evaluate_head(evaluator: DraftEvaluator, eval_batches: list[TargetBatch], args) -> dict:
    """One evaluation of the head's greedy drafts on the held-out batches."""
    sums, timing = evaluate(evaluator, eval_batches, max_batch_tokens=args.eval_batch_tokens, progress=False)
    metrics = finalize(sums)
    return {
        "acceptance_length": float(metrics.acceptance_length),
        "marginal_acceptance_length": float(metrics.marginal_acceptance_length),
        "accuracy": [float(a) for a in metrics.accuracy],
        "accepted_prefix_rate": [float(a) for a in metrics.accepted_prefix_rate],
        "starts": int(sums.starts),
        "seconds": timing["seconds"],
        "table": format_table(metrics, sums),
    }


def eval_line(step: int, record: dict) -> str:
    accuracy = " ".join(f"{a:.3f}" for a in record["accuracy"])
    return (
        f"step {step:>5}  acceptance length {record['acceptance_length']:.3f} "
        f"(product of marginals {record['marginal_acceptance_length']:.3f})  "
        f"accuracy per step {accuracy}  (eval {record['seconds']:.1f}s)"
    )


def plot_curve(log: dict, path: Path, num_steps: int) -> Path:
    evals = log["evals"]
    series = {
        "exact (per start)": [e["acceptance_length"] for e in evals],
        "product of marginals (SpecForge)": [e["marginal_acceptance_length"] for e in evals],
    }
    title = f"EAGLE-3 head on the demo target: held-out greedy acceptance, K = {num_steps}"
    return plot_training_curve([e["step"] for e in evals], series, path, title=title)


def timing_line(log: dict, compiled: bool) -> str:
    train = sorted(log["train_seconds"])
    evals = [e["seconds"] for e in log["evals"]]
    first = f" (the first, compile included, {evals[0]:.0f}s)" if compiled else ""
    return (
        f"training {sum(train):.0f}s (median {train[len(train) // 2]:.2f}s a step), "
        f"evaluation {sum(evals):.0f}s{first}, total {log['seconds']:.0f}s"
    )


# ------------------------------------------------------------------------ main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/train_eagle3_head"))
    p.add_argument("--steps", type=int, default=300, help="training steps")
    p.add_argument("--eval-every", type=int, default=25, help="evaluate every N steps (and at 0 and the end)")
    p.add_argument("--draft-steps", "-k", type=int, default=3, help="K: draft steps trained and evaluated")
    p.add_argument("--batch", type=int, default=8, help="windows per training step")
    p.add_argument("--seq-len", type=int, default=128, help="bytes per window (training and evaluation)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--eval-windows", type=int, default=64, help="held-out windows evaluated")
    p.add_argument("--eval-batch-tokens", type=int, default=1024, help="rows per compiled evaluation call")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", default="cpu")
    # On a CPU its ~40 s compile outweighs the few per cent a step it saves over a few hundred steps.
    p.add_argument("--compile-train", action="store_true", help="compile the loss and its backward (fullgraph)")
    p.add_argument("--eager-eval", action="store_true", help="do not compile the evaluator")
    p.add_argument("--no-save", action="store_true", help="do not save the trained head")
    p.add_argument("--save-eval-data", action="store_true", help="also save the held-out batch under OUT/eval_data")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    positive = ("steps", "eval_every", "draft_steps", "batch", "eval_windows", "eval_batch_tokens", "warmup")
    for name in positive:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    # A window must leave a row past the K target rows of its first start.
    if args.seq_len < args.draft_steps + 2:
        p.error(f"--seq-len must be at least --draft-steps + 2 = {args.draft_steps + 2}, got {args.seq_len}")
    if args.seq_len > 1024:
        p.error(f"--seq-len must be at most 1024 (the demo target's max_position_embeddings), got {args.seq_len}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        p.error(f"--lr must be a positive number, got {args.lr}")
    if args.threads < 0:
        p.error(f"--threads must be 0 (torch's default) or more, got {args.threads}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()

    train_data = read_text_bytes(demo_files("train_files"))
    held_data = read_text_bytes(demo_held_out_files())
    print(f"training text {train_data.numel() / 1e6:.2f} MB, held-out text {held_data.numel() / 1e6:.2f} MB")
    target = frozen_target(args.device)
    head = fresh_head(target, args.seed, args.device)
    eval_batches = [capture(target, spread_windows(held_data, args.eval_windows, args.seq_len))]
    evaluator = DraftEvaluator(head, num_steps=args.draft_steps, compile=not args.eager_eval)

    opt = torch.optim.AdamW(trainable_parameters(head), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    loss_fn = torch.compile(distill_loss, fullgraph=True) if args.compile_train else distill_loss
    log = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "loss": [], "loss_per_step": [], "train_seconds": [], "evals": []}  # fmt: skip

    def record_eval(step):
        record = evaluate_head(evaluator, eval_batches, args)
        log["evals"].append({"step": step, **{k: v for k, v in record.items() if k != "table"}})
        bar.write(eval_line(step, record))
        return record

    bar = tqdm(range(args.steps), desc="train", unit="step", disable=args.no_progress)
    record = record_eval(0)
    for step in bar:
        tick = time.perf_counter()
        per_step = train_step(head, target, opt, loss_fn, sample_windows(train_data, args.batch, args.seq_len, gen),
                              args, step)  # fmt: skip
        log["train_seconds"].append(time.perf_counter() - tick)
        losses = per_step.tolist()
        log["loss"].append(sum(STEP_WEIGHT**k * x for k, x in enumerate(losses)))
        log["loss_per_step"].append(losses)
        bar.set_postfix(loss=f"{log['loss'][-1]:.3f}")
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            record = record_eval(step + 1)
    bar.close()

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    plot_curve(log, out / "acceptance.png", args.draft_steps)
    if not args.no_save:
        save_draft_model(head, out / "head", shared=("embed_tokens",))
    if args.save_eval_data:
        (out / "eval_data").mkdir(exist_ok=True)
        save_batch(out / "eval_data" / "held_out.safetensors", eval_batches[0], aux_layers=default_aux_layers(4),
                   target=str(DEMO_PAIR / "target"))  # fmt: skip
    log["seconds"] = time.perf_counter() - start
    (out / "log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"\nfinal evaluation (step {args.steps}, {eval_batches[0].num_tokens} held-out bytes):\n{record['table']}")
    print(f"\nwrote {out / 'acceptance.png'}, {out / 'log.json'}" + ("" if args.no_save else f", {out / 'head'}"))
    print(timing_line(log, compiled=not args.eager_eval))
    return log


if __name__ == "__main__":
    main()
