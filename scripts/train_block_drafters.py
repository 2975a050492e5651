"""Train the demo pair's block drafters, a DFlash and a DSpark head, on the shipped
target (src/specdraft/assets/demo_pair/target, frozen and never rewritten), with the
data and budget of the shipped EAGLE-3 head (scripts/train_demo_pair.py's head phase,
its settings read from the pair's training.json): the same stdlib files and held-out
split (training.json's file lists), seq_len, batch, AdamW with warmup + cosine, the
same mix of the target's greedy continuations (every greedy_every-th batch), the same
step count and the same time budget per head.

The heads (specdraft.models.BlockDraftHead on a Llama backbone, saved as
"LlamaDSparkModel"): block_size 7 and target_layer_ids [0, 1, 2] (DeepSpec's numbering:
the outputs of the target's layers 0-2, its aux layers 1-3; the last layer is not an aux
state), mask token 0 (NUL: no byte of Python source), --draft-layers decoder layers of
the target's width (default 2, the EAGLE-3 head has 1: a block drafter drafts 7 tokens
in one forward with no draft fed back, so it gets the depth a chain gets from its
steps; 2 sequential layers per block is still fewer than a K = 3 chain's 3 steps);
DSpark adds a vanilla Markov head of rank 64 (a quarter of the 256-byte vocabulary; the
bigram table it factors is 256 x 256) and a confidence head reading the Markov
embedding too (DeepSpec's dspark configs: confidence_head_with_markov).
Embedding and lm_head are the target's own modules (share_from), frozen; the final
norm starts from the target's, as the EAGLE-3 head's did; the rest is initialised as
train_demo_pair.init_weights does.

Training is DeepSpec's (specdraft.training.block): num_anchors anchors per sequence
drawn as its sample_anchor_positions draws them (sample_anchors, per sequence), one
forward over every anchor's block with teacher forcing, DeepSpec's labels, and its
losses: DFlash CE with the positional decay exp(-k / 4) (DFLASH_LOSS); DSpark 0.1 CE +
0.9 L1 (against the target's distribution) + 1.0 confidence BCE (DSPARK_LOSS). On CUDA
the loss is compiled (fullgraph, static shapes: the fused flex attention kernel) and
the head runs in fp32 with TF32 matmuls while the frozen target runs under bf16
autocast, as in train_demo_pair.py; the compile runs once before each head's timed
phase (its seconds recorded apart). On the CPU the loss runs eagerly with dense
attention, --seqs-per-forward sequences per forward (the dense scores grow with the
packed length).

Evaluation (the shipped EAGLE-3 head too, as the baseline): DraftEvaluator (greedy,
the heads' own drafts: the block drafters' Markov heads read their own greedy tokens)
on the held-out windows and on the target's greedy continuations of held-out prompts
(scored past the prompt only); per head the exact greedy acceptance length
1 + accepted drafts per verification (DeepSpec's "accepted prefix of the block + 1")
at K = 3 and K = block_size, over the starts where all block_size drafts are scored.

Outputs: OUT/dflash, OUT/dspark (save_block_drafter, DeepSpec's layout, without the
embedding and lm_head: the target supplies them, specdraft.assets.load_demo_drafter)
and OUT/training.json: the pair's record (OUT's own if it has one, else --record) with a
"block_drafters" entry (settings, steps, timings, losses, metrics); a run of one
drafter keeps the other's entry.

    python scripts/train_block_drafters.py                          # on a GPU: the shipped heads
    bash scripts/gpu_block.sh train                                 # the same on the device, OUT/demo_heads
    python scripts/train_block_drafters.py --quick --out /tmp/blk   # CPU smoke run

The GPU run's settings are all defaults (training.json's head phase: --budget-s 105
per head, --head-steps 3000, --batch 32, --seq-len 1024; 512 anchors per sequence).
Should the compiled flex path fail on a GPU, --no-compile --seqs-per-forward 1 trains
the same loss eagerly with dense attention, one sequence per forward (slower: fewer
steps fit the budget). The committed CPU stand-ins came from

    python scripts/train_block_drafters.py --device cpu --batch 8 --seq-len 256 \
        --prompt-len 64 --num-anchors 128 --pool 64 --eval-windows 32 --budget-s 240

(training.json's block_drafters.heads.<name>.run says which command made each head).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import platform
import sys
import sysconfig
import time
from pathlib import Path

import torch

from specdraft.models import BlockConfig, BlockDraftHead, default_aux_layers, load_draft_model, save_block_drafter
from specdraft.models.target_loading import load_target_model
from specdraft.training import (
    DFLASH_LOSS,
    DSPARK_LOSS,
    DraftEvaluator,
    TargetBatch,
    aligned_target_logits,
    block_forward,
    block_labels,
    block_loss,
    evaluate,
    finalize,
    sample_anchors,
)
from specdraft.training.block import loss_weights


def sibling(name: str):
    """scripts/<name>.py as a module (this script reuses its data, dense target,
    greedy generation and training loop)."""
    path = Path(__file__).resolve().with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pair = sibling("train_demo_pair")

PAIR = Path(__file__).resolve().parents[1] / "src" / "specdraft" / "assets" / "demo_pair"

DRAFTERS = ("dflash", "dspark")
LOSSES = {"dflash": DFLASH_LOSS, "dspark": DSPARK_LOSS}
# The head phase's settings of the pair's run that this script repeats (training.json).
SHARED_SETTINGS = ("seed", "seq_len", "batch", "head_steps", "greedy_every", "pool", "prompt_len", "lr", "warmup",
                   "budget_s", "eval_windows", "log_every")  # fmt: skip
LOG_PARTS = ("loss", "ce", "l1", "confidence", "tau")
WHY = {
    "draft_layers": "a block drafter drafts block_size tokens in one forward with no draft fed back, so it gets in "
    "depth what a chain gets from its steps (DeepSpec: 5 draft layers for a 36-layer target, EAGLE-3 1); 2 "
    "sequential layers per block cost less than a K = 3 chain's 3 head steps",
    "target_layer_ids": "DeepSpec's spread over the target's depth, the last layer excluded: all of 0-2 for 4 layers "
    "(aux layers 1-3)",
    "markov_rank": "64: a quarter of the 256-byte vocabulary (DeepSpec's 256 of Qwen3's 151,936 would be a "
    "full-rank bigram table here)",
    "mask_token_id": "0, NUL: never in Python source; its embedding is the frozen target's",
    "num_anchors": "per sequence; DeepSpec's 512 (of 4,096-token samples), here half a 1,024-byte window",
}
EVAL_NOTE = (
    "DraftEvaluator, greedy, the heads' own drafts, eager dense attention; acceptance length = 1 + accepted drafts per "
    "verification (tokens per target pass), at K = 3 and K = block_size over the starts whose block_size drafts are "
    "all scored; eagle3 = the shipped EAGLE-3 head's chain (recomputed by each run)"
)

# ------------------------------------------------------------------------ data


def recorded_files(record: dict) -> tuple[Path, list[str], list[str], list[str]]:
    """(stdlib root, train files, held-out files, missing): training.json's lists,
    found in the running interpreter's stdlib (the pair was trained on Python 3.12's;
    files this Python lacks are left out and listed)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = {split: [f for f in record[split] if (root / f).is_file()] for split in ("train_files", "held_out_files")}
    missing = sorted(set(record["train_files"] + record["held_out_files"]) - {f for v in found.values() for f in v})
    if not found["train_files"] or not found["held_out_files"]:
        raise SystemExit(f"{root}: none of training.json's train or held-out files are here")
    return root, found["train_files"], found["held_out_files"], missing


def per_sequence_anchors(num_seqs: int, length: int, num_anchors: int, gen: torch.Generator):
    """(anchors [num_seqs, num_anchors] int64, keep [same] bool): DeepSpec's anchors
    of each sequence (rows within it), drawn on the CPU from `gen`."""
    cu = torch.tensor([0, length])
    parts = [sample_anchors(cu, length, num_anchors, generator=gen) for _ in range(num_seqs)]
    return torch.stack([a for a, _ in parts]), torch.stack([k for _, k in parts])


def packed(ids: torch.Tensor, aux: torch.Tensor, target_logits: torch.Tensor):
    """[B, L] windows as one packed batch: (token_ids [T], hidden [T, W] fp32,
    positions [T], cu_seqlens [B + 1], target_logits [T, V] fp32)."""
    b, length = ids.shape
    positions = torch.arange(length, device=ids.device).repeat(b)
    cu_seqlens = torch.arange(b + 1, device=ids.device) * length
    return (ids.reshape(-1), aux.reshape(b * length, -1).float(), positions, cu_seqlens,
            target_logits.reshape(b * length, -1).float())  # fmt: skip


# ------------------------------------------------------------------------ heads


def block_head(kind: str, target, args) -> BlockDraftHead:
    config = dataclasses.replace(
        target.config, num_layers=args.draft_layers, target_hidden_size=target.config.hidden_size,
        extra={"num_anchors": args.num_anchors},
    )  # fmt: skip
    dspark = kind == "dspark"
    block = BlockConfig(
        block_size=args.block_size, mask_token_id=args.mask_token_id, target_layer_ids=tuple(args.target_layer_ids),
        num_target_layers=target.config.num_layers, markov_rank=args.markov_rank if dspark else 0,
        markov_head_type="vanilla" if dspark else None, confidence_head=dspark, confidence_with_markov=dspark,
    )  # fmt: skip
    return BlockDraftHead(config, block)


def init_head(head: BlockDraftHead, target, gen: torch.Generator) -> None:
    """train_demo_pair's init; then the target's embedding and lm_head (frozen: the
    target's requires_grad is off) and its final norm as the starting one."""
    pair.init_weights(head, head.config.num_layers, gen)
    head.share_from(target)
    with torch.no_grad():
        head.norm.weight.copy_(target.norm.weight)


# ------------------------------------------------------------------------ the loss


def group_loss(head, weights, token_ids, hidden, positions, cu_seqlens, target_logits, anchors, keep):
    """DeepSpec's loss of one packed group (compiled on CUDA). Returns (loss, ce, l1,
    confidence loss, the group's total loss weight, the sum over kept anchors of
    DeepSpec's tau_probabilistic: 1 + sum_k prod_{i <= k} alpha_i, and the kept
    anchors' count)."""
    out = block_forward(head, token_ids, hidden, positions, cu_seqlens, anchors, keep)
    labels = block_labels(token_ids, cu_seqlens, anchors, keep, block_size=head.block_size)
    result = block_loss(out.logits, labels, target_logits=aligned_target_logits(target_logits, labels),
                        confidence=out.confidence, weights=weights)  # fmt: skip
    total_weight = loss_weights(labels.eval_mask, weights.loss_decay_gamma).sum()
    alive = torch.cumprod(result.accept_rate * labels.eval_mask, dim=-1)
    tau = ((1 + alive.sum(-1)) * keep).sum()
    return result.loss, result.ce, result.l1, result.confidence, total_weight, tau, keep.sum()


class BlockTrainer:
    """One training step's loss for a head: target features, anchors, groups."""

    def __init__(self, head, target, weights, args, device):
        self.head, self.target, self.weights, self.args, self.device = head, target, weights, args, device
        self.aux_layers = head.block.aux_layers
        self.per = args.seqs_per_forward or args.batch
        if args.batch % self.per:
            raise SystemExit(f"--seqs-per-forward {self.per} must divide --batch {args.batch}")
        self.loss = group_loss
        if device.type == "cuda" and not args.no_compile:
            self.loss = torch.compile(group_loss, fullgraph=True, dynamic=False)

    @torch.no_grad()
    def features(self, ids):
        """The frozen target's aux states (the head's layers) and logits, [B, L, .]."""
        hidden, aux = pair.dense_target(self.target, ids, self.aux_layers)
        return aux, self.target.compute_logits(hidden)

    def __call__(self, ids, gen: torch.Generator):
        """(loss, [loss, ce, l1, confidence, tau] detached) of a [B, L] batch: its
        groups of seqs_per_forward sequences, each term a weighted mean over the
        whole batch (DeepSpec's: the groups' means weighted by their loss weight)."""
        aux, logits = self.features(ids)
        anchors, keep = per_sequence_anchors(ids.shape[0], ids.shape[1], self.args.num_anchors, gen)
        offsets = torch.arange(self.per)[:, None] * ids.shape[1]
        parts = []
        with torch.autocast(self.device.type, enabled=False):  # the head in fp32 (TF32 matmuls on CUDA)
            for g in range(0, ids.shape[0], self.per):
                group = packed(ids[g : g + self.per], aux[g : g + self.per], logits[g : g + self.per])
                rows = (anchors[g : g + self.per] + offsets).reshape(-1).to(self.device)
                parts.append(self.loss(self.head, self.weights, *group, rows, keep[g : g + self.per].reshape(-1)
                                       .to(self.device)))  # fmt: skip
        weight = sum(p[4] for p in parts)
        terms = [sum(p[i] * p[4] for p in parts) / weight for i in range(4)]
        tau = sum(p[5] for p in parts) / sum(p[6] for p in parts)
        return terms[0], [t.detach() for t in terms] + [tau.detach()]


def warm_up(trainer: BlockTrainer, data: torch.Tensor, args, seed: int) -> float:
    """One step's forward and backward before the timed phase (the CUDA compile),
    on a batch of its own; the gradients are dropped. Seconds."""
    start = time.perf_counter()
    ids = pair.sample_windows(data, args.batch, args.seq_len, torch.Generator().manual_seed(seed))
    with pair.autocast(trainer.device):
        loss, _ = trainer(ids, torch.Generator().manual_seed(seed))
    loss.backward()
    trainer.head.zero_grad(set_to_none=True)
    pair.sync(trainer.device)
    return time.perf_counter() - start


def train_head(kind, target, train_data, pool, args, device, gen) -> tuple[BlockDraftHead, dict]:
    head = block_head(kind, target, args)
    init_head(head, target, gen)
    head.to(device).train()
    trainer = BlockTrainer(head, target, LOSSES[kind], args, device)
    compile_s = warm_up(trainer, train_data, args, args.seed + 1)
    compiled = " (compile)" if trainer.loss is not group_loss else ""
    print(f"[{kind}] warm-up step{compiled}: {compile_s:.1f}s", flush=True)

    def loss_fn(step):
        if args.greedy_every and step % args.greedy_every == args.greedy_every - 1:
            ids = pool[torch.randint(0, pool.shape[0], (args.batch,), generator=gen).to(device)]
        else:
            ids = pair.sample_windows(train_data, args.batch, args.seq_len, gen)
        return trainer(ids, gen)

    trainable = [p for p in head.parameters() if p.requires_grad]
    run = pair.train_loop(kind, trainable, args.head_steps, args, loss_fn, device)
    run["log_columns"] = ["step", *LOG_PARTS]
    run["warm_up_seconds"] = compile_s
    run["trainable_parameters"] = sum(p.numel() for p in trainable)
    return head.eval(), run


def save_head(head: BlockDraftHead, folder: Path) -> None:
    """DeepSpec's layout without the target's embedding and lm_head (fp32, on the CPU)."""
    state = {k: v.detach().cpu() for k, v in head.state_dict().items()}
    cpu_head = BlockDraftHead(head.config, head.block)
    cpu_head.load_state_dict(state)
    save_block_drafter(cpu_head, folder, shared=("embed_tokens", "lm_head"))


# ------------------------------------------------------------------------ evaluation


@torch.no_grad()
def target_batches(target, windows: torch.Tensor, aux_layers, scored_from: int = 0) -> list[TargetBatch]:
    """The target's outputs over [N, L] windows as packed TargetBatches of 8
    sequences; loss_mask scores target rows >= scored_from only."""
    out = []
    for ids in windows.split(8):
        hidden, aux = pair.dense_target(target, ids, aux_layers)
        token_ids, feats, positions, cu_seqlens, logits = packed(ids, aux, target.compute_logits(hidden))
        mask = positions >= scored_from
        out.append(TargetBatch(token_ids, feats, logits, positions, cu_seqlens, mask))
    return out


def acceptance(head, batches, num_steps: int) -> dict:
    """Greedy DraftEvaluator sums (eager, dense attention), as ratios."""
    evaluator = DraftEvaluator(head, num_steps=num_steps, compile=False)
    sums, timing = evaluate(evaluator, batches, max_batch_tokens=1024, progress=False)
    m = finalize(sums)
    prefix = m.accepted_prefix_rate.tolist()
    return {
        "acceptance_length": {f"k{k}": 1 + sum(prefix[:k]) for k in sorted({3, num_steps})},
        "accepted_prefix_rate": prefix,
        "accuracy": m.accuracy.tolist(),
        "starts": int(sums.starts),
        "seconds": timing["seconds"],
    }


def evaluate_heads(target, heads: dict, windows, continued, args) -> dict:
    """{dataset: {name: acceptance}} for the EAGLE-3 baseline and the block heads."""
    out = {"held_out": {}, "held_out_greedy_continuations": {}}
    for name, head in heads.items():
        layers = head.block.aux_layers if isinstance(head, BlockDraftHead) else default_aux_layers(4)
        for key, data, first in (("held_out", windows, 0), ("held_out_greedy_continuations", continued,
                                                              args.eval_prompt_len)):  # fmt: skip
            out[key][name] = acceptance(head, target_batches(target, data, layers, first), args.block_size)
            print(f"[eval] {name} {key}: acceptance length "
                  + ", ".join(f"{k} {v:.3f}" for k, v in out[key][name]["acceptance_length"].items()), flush=True)  # fmt: skip
    return out


# ------------------------------------------------------------------------ main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=PAIR, help="where dflash/, dspark/ and training.json go")
    p.add_argument("--target", type=Path, default=PAIR / "target")
    p.add_argument("--record", type=Path, default=PAIR / "training.json",
                   help="the pair's training.json: the head phase's settings and file lists")  # fmt: skip
    p.add_argument("--drafters", default=",".join(DRAFTERS), help="comma-separated: dflash, dspark")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--block-size", type=int, default=7)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--target-layer-ids", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--mask-token-id", type=int, default=0)
    p.add_argument("--markov-rank", type=int, default=64)
    p.add_argument("--num-anchors", type=int, default=512, help="anchors per sequence (DeepSpec's num_anchors)")
    p.add_argument("--seqs-per-forward", type=int, default=None,
                   help="sequences per block forward (default: the whole batch on CUDA, 1 on the CPU)")  # fmt: skip
    for name in SHARED_SETTINGS:
        kind = float if name in ("lr", "budget_s") else int
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help="default: training.json's")
    p.add_argument("--eval-len", type=int, default=None, help="held-out window length (default: training.json's "
                   "seq_len, whatever --seq-len trains on)")  # fmt: skip
    p.add_argument("--eval-prompt-len", type=int, default=None, help="prompt of the greedy continuations evaluated "
                   "(default: training.json's prompt_len)")  # fmt: skip
    p.add_argument("--no-compile", action="store_true", help="CUDA: the loss eagerly, dense attention (with "
                   "--seqs-per-forward 1: the dense scores of one sequence at a time)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="tiny CPU smoke run")
    args = p.parse_args(argv)
    args.drafters = [d for d in args.drafters.split(",") if d]
    if not args.drafters or set(args.drafters) - set(DRAFTERS):
        p.error(f"--drafters must name some of {DRAFTERS}, got {args.drafters}")
    settings = json.loads(args.record.read_text())["settings"]
    for name in SHARED_SETTINGS:
        if getattr(args, name) is None:
            setattr(args, name, settings[name])
    args.eval_len = settings["seq_len"] if args.eval_len is None else args.eval_len
    args.eval_prompt_len = settings["prompt_len"] if args.eval_prompt_len is None else args.eval_prompt_len
    if args.quick:
        args.seq_len, args.batch, args.head_steps, args.num_anchors = 64, 4, 6, 16
        args.eval_len, args.eval_prompt_len = 64, 32
        args.pool, args.prompt_len, args.eval_windows, args.log_every, args.warmup, args.budget_s = 8, 32, 4, 2, 2, 0.0
    if args.seqs_per_forward is None:
        args.seqs_per_forward = args.batch if args.device.startswith("cuda") else 1
    return args


def read_record(args) -> dict:
    """OUT/training.json when there is one (a later run adds to it), else --record."""
    own = args.out / "training.json"
    return json.loads((own if own.is_file() else args.record).read_text())


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # the fp32 head's matmuls in TF32
    t0 = time.perf_counter()
    record = read_record(args)
    root, train_files, held_files, missing = recorded_files(json.loads(args.record.read_text()))
    train_data = pair.read_bytes(root, train_files).to(device)
    held_data = pair.read_bytes(root, held_files)
    print(f"stdlib {root}: {len(train_files)} training files ({train_data.numel() / 1e6:.1f} MB), {len(held_files)} "
          f"held out, {len(missing)} of training.json's files missing here", flush=True)  # fmt: skip
    n_eval = min(args.eval_windows, held_data.numel() // args.eval_len)
    eval_windows = held_data[: n_eval * args.eval_len].view(n_eval, args.eval_len).long().to(device)

    target = load_target_model(args.target, device=device).eval().requires_grad_(False)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    t_gen = time.perf_counter()
    prompts = pair.sample_windows(train_data, args.pool, args.prompt_len, gen)
    pool = torch.cat([pair.greedy_generate(target, c, args.seq_len - args.prompt_len) for c in prompts.split(512)])
    gen_seconds = time.perf_counter() - t_gen
    print(f"greedy pool: {tuple(pool.shape)} in {gen_seconds:.1f}s", flush=True)

    heads, runs = {}, {}
    for kind in args.drafters:
        heads[kind], runs[kind] = train_head(kind, target, train_data, pool, args, device, gen)
        save_head(heads[kind], args.out / kind)  # saved before the evaluation: a run cut short keeps it

    continued = pair.greedy_generate(
        target, eval_windows[:64, : args.eval_prompt_len], args.eval_len - args.eval_prompt_len
    )
    eagle3 = load_draft_model(PAIR / "eagle3", method="eagle3", device=device).eval()
    eagle3.share_from(target)
    metrics = evaluate_heads(target, {"eagle3": eagle3, **heads}, eval_windows, continued, args)
    for name, value in target.state_dict().items():
        if not torch.equal(value, before[name]):
            raise SystemExit(f"the target's {name} changed during training")

    run = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "data": {"train_files": len(train_files), "held_out_files": len(held_files), "missing_files": missing},
        "greedy_pool_seconds": gen_seconds,
        "total_seconds": time.perf_counter() - t0,
    }
    entry = record.get("block_drafters", {}) | {"why": WHY, "eval": EVAL_NOTE}
    for kind in args.drafters:  # a run of one drafter keeps the other's entry (its own run's record)
        entry.setdefault("heads", {})[kind] = {
            "run": run,
            "loss": LOSSES[kind]._asdict(),
            "config": json.loads(json.dumps(dataclasses.asdict(heads[kind].block))),
            "training": runs[kind],
        }
    for key, per_head in metrics.items():
        entry.setdefault("metrics", {}).setdefault(key, {}).update(per_head)
    record["block_drafters"] = entry
    (args.out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(metrics, indent=1), flush=True)
    print(f"saved {', '.join(heads)} to {args.out} in {run['total_seconds']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
