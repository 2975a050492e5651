"""Train the demo's target / draft pair from a seed (the seed and the step counts fix
the data order and the initialisation; GPU kernels with atomic reductions may move
the last bits):

(a) a small Llama-style byte-level target (vocabulary: the 256 byte values) on the
    Python standard library's own source, read from the running interpreter's Lib/
    (a fixed, sorted file list; every 25th file is held out);
(b) an EAGLE-3 head (Eagle3Head: one layer of the target's width, fusing the target
    layers default_aux_layers(N) picks), distilled on the frozen target: at position t
    it reads the target's aux hidden states at t (combine_hidden_states) and the
    embedding of token t+1 and learns the target's distribution over token t+2 (soft
    cross-entropy; agreement is measured against the target's argmax). Steps 1 and 2
    are unrolled as the proposer drafts them: step k at position t+k feeds the head's
    own pre-norm hidden state of step k-1 and token t+1+k, and attends to step 0's
    keys at positions <= t plus its own earlier steps' keys at t+1 .. t+k.

Both train through a dense path (SDPA attention) that calls the serving modules' own
submodules (projections, norms, rotary, MLP), because the paged path materialises
per-request keys and score matrices that make training several times slower;
tests/assets/test_demo_pair.py proves the dense path equal to TinyTargetModel / Eagle3Head
over the paged KV cache, including the unrolled steps against the decode steps.
Part of the head's batches are the target's own greedy continuations (generated
through the paged cache), the text a greedy demo drafts over.

Outputs (fp32): OUT/target (save_target_model), OUT/eagle3 (save_draft_model, without
embed_tokens: it is the target's, restored by share_from(target)), OUT/training.json
(Python version, file lists, settings, metrics).

    python scripts/train_demo_pair.py --out src/specdraft/assets/demo_pair   # on a GPU
    python scripts/train_demo_pair.py --quick --out /tmp/pair                # CPU smoke run

--budget-s caps each phase's time (the step count is cut after a timing of steps
10..30 and recorded in training.json); rerun with --target-steps / --head-steps set to
the recorded counts and no budget to repeat a run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specdraft.layout import BatchMetadata
from specdraft.models import DraftModelConfig, Eagle3Head, TinyTargetModel, default_aux_layers, save_draft_model
from specdraft.models.target_loading import save_target_model

# cuBLAS picks deterministic kernels with a fixed workspace (set before CUDA starts).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
VOCAB = 256
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
HELD_OUT_EVERY = 25

# ------------------------------------------------------------------------ data


def stdlib_files(root: Path | None = None) -> tuple[Path, list[str]]:
    """The stdlib root and its .py files (relative, sorted), tests and installed
    packages left out."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    files = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if not SKIP_DIRS & set(p.relative_to(root).parts[:-1])
    )
    if not files:
        raise SystemExit(f"no .py files under {root}")
    return root, files


def split_files(files: list[str]) -> tuple[list[str], list[str]]:
    held = [f for i, f in enumerate(files) if i % HELD_OUT_EVERY == HELD_OUT_EVERY // 2]
    return [f for f in files if f not in set(held)], held


def read_bytes(root: Path, files: list[str]) -> torch.Tensor:
    """The files' bytes back to back (a blank line between files), as uint8."""
    blob = b"\n\n".join((root / f).read_bytes() for f in files)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def sample_windows(data: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - length, (batch,), generator=gen)
    return data[(starts[:, None] + torch.arange(length)).to(data.device)].long()


# ------------------------------------------------------------------------ models


def target_config(args) -> DraftModelConfig:
    return DraftModelConfig(
        hidden_size=args.width,
        intermediate_size=args.ffn,
        num_heads=args.width // 64,
        num_kv_heads=max(1, args.width // 128),
        vocab_size=VOCAB,
        num_layers=args.layers,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        extra={"max_position_embeddings": args.max_positions},
    )


def head_config(target: DraftModelConfig) -> DraftModelConfig:
    return DraftModelConfig(
        hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size,
        num_heads=target.num_heads,
        num_kv_heads=target.num_kv_heads,
        vocab_size=VOCAB,
        target_hidden_size=target.hidden_size,
        rms_norm_eps=target.rms_norm_eps,
        rope_theta=target.rope_theta,
        extra={
            "architectures": ["LlamaForCausalLMEagle3"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(default_aux_layers(target.num_layers))},
        },
    )


def init_weights(module: torch.nn.Module, num_layers: int, gen: torch.Generator) -> None:
    """GPT-2 style: N(0, 0.02), output projections scaled by 1 / sqrt(2 N); norms 1."""
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                std = 0.02 / math.sqrt(2 * num_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=gen) * std)


# ------------------------------------------------------------------------ dense path


def dense_attention(attn, x, positions, past=None, step=0):
    """SelfAttention's math without the cache, for [B, L, Hin] inputs.

    step 0: plain causal attention. step k > 0 (an unrolled draft step): `past` holds
    the keys / values of steps 0 .. k-1 ([B, L, kv_heads, D] each); row i sees step
    0's rows 0 .. i and row i of steps 1 .. k (itself included). Returns
    (output [B, L, H], past + this step's keys / values)."""
    b, length, _ = x.shape
    q = attn.q_proj(x).view(b * length, attn.num_heads, attn.head_dim)
    k = attn.k_proj(x).view(b * length, attn.num_kv_heads, attn.head_dim)
    v = attn.v_proj(x).view(b, length, attn.num_kv_heads, attn.head_dim)
    q, k = attn.rotary(positions.reshape(-1), q, k)
    q = q.view(b, length, attn.num_heads, attn.head_dim)
    k = k.view(b, length, attn.num_kv_heads, attn.head_dim)
    past = [*(past or []), (k, v)]
    group = attn.num_heads // attn.num_kv_heads
    keys = torch.cat([kk for kk, _ in past], 1).repeat_interleave(group, 2).transpose(1, 2)
    values = torch.cat([vv for _, vv in past], 1).repeat_interleave(group, 2).transpose(1, 2)
    if step == 0:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=True)
    else:
        eye = torch.eye(length, dtype=torch.bool, device=x.device)
        mask = torch.cat([torch.ones_like(eye).tril()] + [eye] * step, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask)
    out = out.transpose(1, 2).reshape(b, length, attn.num_heads * attn.head_dim)
    return attn.o_proj(out), past


def dense_target(model: TinyTargetModel, ids: torch.Tensor, aux_layers=()):
    """TinyTargetModel.forward for [B, L] sequences each starting at position 0:
    (final hidden [B, L, H], aux [B, L, len(aux_layers) * H] or None)."""
    positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape)
    h = model.embed_tokens(ids)
    entering = []
    for layer in model.layers:
        entering.append(h)
        attn_out, _ = dense_attention(layer.self_attn, layer.input_layernorm(h), positions)
        h = h + attn_out
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    aux = torch.cat([entering[i] for i in aux_layers], -1) if aux_layers else None
    return model.norm(h), aux


def shifted(ids: torch.Tensor, by: int) -> torch.Tensor:
    """ids[:, t + by] at column t (0 past the end)."""
    return torch.cat([ids[:, by:], ids.new_zeros(ids.shape[0], by)], 1)


def dense_head_unroll(head: Eagle3Head, aux: torch.Tensor, ids: torch.Tensor, num_steps: int) -> list[torch.Tensor]:
    """The head's hidden-for-sampling of steps 0 .. num_steps-1, each [B, L, H]: row t
    of step k sits at position t + k and reads token ids[t + 1 + k]; step 0 reads the
    fused aux states at t, step k > 0 the pre-norm output of step k-1 at row t."""
    layer = head.midlayer
    base = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape)
    hidden = head.combine_hidden_states(aux)
    past, outs = None, []
    for step in range(num_steps):
        emb = head.embed_tokens(shifted(ids, 1 + step))
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden.to(emb.dtype))], -1)
        attn_out, past = dense_attention(layer.self_attn, x, base + step, past, step)
        h = hidden + attn_out
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        outs.append(head.norm(h))
        hidden = h
    return outs


# ------------------------------------------------------------------------ paged generation


@torch.no_grad()
def greedy_generate(model: TinyTargetModel, prompts: torch.Tensor, new_tokens: int, block_size: int = 16):
    """[B, P] prompts -> [B, P + new_tokens]: the target's greedy continuation, run
    through TinyTargetModel's paged KV cache (prefill, then one token per step)."""
    b, p = prompts.shape
    total = p + new_tokens
    per = -(-total // block_size)
    device = prompts.device
    table = torch.arange(b * per, dtype=torch.int32, device=device).view(b, per)
    caches = model.allocate_kv_caches(b * per, block_size)
    rows = torch.arange(b, device=device)

    def metadata(start, length):
        pos = torch.arange(start, start + length, device=device)
        slots = table[:, pos // block_size].long() * block_size + pos % block_size
        md = BatchMetadata(
            query_start_loc=(torch.arange(b + 1, device=device) * length).to(torch.int32),
            seq_lens=torch.full((b,), start + length, dtype=torch.int32, device=device),
            block_table=table,
            slot_mapping=slots.reshape(-1),
            max_query_len=length,
            max_seq_len=start + length,
        )
        return pos.repeat(b), md

    out = torch.empty(b, total, dtype=torch.long, device=device)
    out[:, :p] = prompts
    pos, md = metadata(0, p)
    hidden, _ = model(prompts.reshape(-1).to(torch.int32), pos, md, caches)
    out[:, p] = model.compute_logits(hidden.view(b, p, -1)[:, -1]).argmax(-1)
    for t in range(p, total - 1):
        pos, md = metadata(t, 1)
        hidden, _ = model(out[rows, t].to(torch.int32), pos, md, caches)
        out[:, t + 1] = model.compute_logits(hidden).argmax(-1)
    return out


# ------------------------------------------------------------------------ training


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_loop(name, params, total_steps, args, loss_fn, device):
    """AdamW with warmup + cosine. With args.budget_s, the time of steps 10..30
    projects the phase's length; past the budget, the step count is cut (the cosine
    schedule re-planned before it matters) and the count used is recorded."""
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda")
    planned, start, log = total_steps, time.perf_counter(), []
    step, tick = 0, start
    while step < total_steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total_steps, args.lr, args.warmup)
        with autocast(device):
            loss, parts = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step == 10 and args.budget_s:
            sync(device)
            tick = time.perf_counter()
        if step == 30 and args.budget_s:
            sync(device)
            per_step = (time.perf_counter() - tick) / 20  # past the first steps' warm-up
            fits = int((args.budget_s - (tick - start)) / per_step) + 10
            if fits < total_steps:
                print(f"[{name}] {per_step * 1e3:.1f} ms/step: cutting {total_steps} steps to {fits}", flush=True)
                total_steps = max(fits, 40)
        if step % args.log_every == 0 or step == total_steps:
            values = [float(v) for v in parts]
            log.append([step, *values])
            print(f"[{name}] step {step}/{total_steps} " + " ".join(f"{v:.4f}" for v in values)
                  + f" ({time.perf_counter() - start:.0f}s)", flush=True)  # fmt: skip
    sync(device)
    return {"planned_steps": planned, "steps": total_steps, "seconds": time.perf_counter() - start, "log": log}


def soft_ce(logits, probs, valid):
    """Mean over valid rows of -sum p log q."""
    ce = -(probs * F.log_softmax(logits.float(), -1)).sum(-1)
    return (ce * valid).sum() / valid.sum()


def head_losses(head, target, ids, aux_layers, num_steps):
    with torch.no_grad():
        hidden, aux = dense_target(target, ids, aux_layers)
        probs = F.softmax(target.compute_logits(hidden).float(), -1)
    outs = dense_head_unroll(head, aux, ids, num_steps)
    length = ids.shape[1]
    losses, accs = [], []
    for step, h in enumerate(outs):
        logits = head.compute_logits(h)
        want = shifted_probs(probs, 1 + step)
        valid = (torch.arange(length, device=ids.device) < length - 1 - step).float().expand(ids.shape)
        losses.append(soft_ce(logits, want, valid))
        accs.append(((logits.argmax(-1) == want.argmax(-1)).float() * valid).sum() / valid.sum())
    return losses, accs


def shifted_probs(probs, by):
    return torch.cat([probs[:, by:], probs[:, -by:]], 1)  # the tail rows are masked out


# ------------------------------------------------------------------------ evaluation


@torch.no_grad()
def evaluate(target, head, windows, aux_layers, num_steps, generated_from=None):
    """Target bits per byte on `windows` [N, L] and the head's greedy agreement with
    the target's argmax per step. generated_from=P: rows t >= P - 1 only (the greedy
    continuation), plus the acceptance length a greedy speculative decoder with K =
    num_steps gets there (a draft token counts while it and all before it match)."""
    nll, agree, count, accepted, starts = 0.0, [0.0] * num_steps, [0.0] * num_steps, 0.0, 0.0
    for ids in windows.split(8):
        hidden, aux = dense_target(target, ids, aux_layers)
        logits = target.compute_logits(hidden).float()
        nll += F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="sum").item()
        greedy = logits.argmax(-1)
        length = ids.shape[1]
        t = torch.arange(length, device=ids.device)
        run = torch.ones(ids.shape, device=ids.device)
        first = 0 if generated_from is None else generated_from - 1
        for step, h in enumerate(dense_head_unroll(head, aux, ids, num_steps)):
            match = (head.compute_logits(h).argmax(-1) == shifted(greedy, 1 + step)).float()
            valid = ((t >= first) & (t < length - 1 - num_steps)).float().expand(ids.shape)
            agree[step] += (match * valid).sum().item()
            count[step] += valid.sum().item()
            run = run * match
            accepted += (run * valid).sum().item()
        starts += valid.sum().item()
    out = {
        "bits_per_byte": nll / (windows.shape[0] * (windows.shape[1] - 1)) / math.log(2),
        "head_agreement": [a / c for a, c in zip(agree, count, strict=True)],
    }
    if generated_from is not None:
        out["mean_acceptance_length"] = 1 + accepted / starts  # tokens per target pass, bonus included
        del out["bits_per_byte"]  # the target's own greedy text: not a language-model score
    return out


# ------------------------------------------------------------------------ main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("src/specdraft/assets/demo_pair"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--max-positions", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--target-steps", type=int, default=4000)
    p.add_argument("--head-steps", type=int, default=3000)
    p.add_argument("--head-unroll", type=int, default=3, help="draft steps trained (step 0 plus unrolled steps)")
    p.add_argument("--greedy-every", type=int, default=4, help="every n-th head batch is the target's greedy text")
    p.add_argument("--pool", type=int, default=1024, help="greedy continuations generated for head training")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--budget-s", type=float, default=0.0, help="seconds per phase (cuts steps); 0: every step")
    p.add_argument("--eval-windows", type=int, default=128)
    p.add_argument("--log-every", type=int, default=250)
    p.add_argument("--quick", action="store_true", help="tiny CPU smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.seq_len, args.batch, args.target_steps, args.head_steps = 64, 4, 6, 6
        args.pool, args.prompt_len, args.eval_windows, args.log_every, args.warmup = 8, 32, 8, 2, 2
        args.max_positions = max(args.max_positions, args.seq_len)
    return args


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.perf_counter()

    root, files = stdlib_files()
    train_files, held_files = split_files(files)
    train_data, held_data = read_bytes(root, train_files).to(device), read_bytes(root, held_files)
    print(f"stdlib {root}: {len(train_files)} training files ({train_data.numel() / 1e6:.1f} MB), "
          f"{len(held_files)} held out ({held_data.numel() / 1e6:.2f} MB)", flush=True)  # fmt: skip
    length = args.seq_len
    n_eval = min(args.eval_windows, held_data.numel() // length)
    eval_windows = held_data[: n_eval * length].view(n_eval, length).long().to(device)

    # (a) the target.
    tcfg = target_config(args)
    target = TinyTargetModel(tcfg).to(device)
    init_weights(target, tcfg.num_layers, gen)

    def target_loss(step):
        ids = sample_windows(train_data, args.batch, length, gen)
        hidden, _ = dense_target(target, ids)
        logits = target.compute_logits(hidden)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))
        return loss, [loss.detach() / math.log(2)]

    target.train()
    target_run = train_loop("target", list(target.parameters()), args.target_steps, args, target_loss, device)
    target.eval().requires_grad_(False)

    # (b) the head, on the frozen target: real text and the target's greedy text.
    aux_layers = default_aux_layers(tcfg.num_layers)
    head = Eagle3Head(head_config(tcfg)).to(device)
    init_weights(head, 1, gen)
    head.share_from(target)  # the target's embedding (frozen); the head's own lm_head ...
    with torch.no_grad():  # ... starts from the target's, its final norm too
        head.lm_head.weight.copy_(target.lm_head.weight)
        head.norm.weight.copy_(target.norm.weight)
    t_gen = time.perf_counter()
    prompts = sample_windows(train_data, args.pool, args.prompt_len, gen)
    pool = torch.cat([greedy_generate(target, chunk, length - args.prompt_len) for chunk in prompts.split(512)])
    gen_seconds = time.perf_counter() - t_gen
    print(f"greedy pool: {tuple(pool.shape)} in {gen_seconds:.1f}s", flush=True)

    def head_loss(step):
        if args.greedy_every and step % args.greedy_every == args.greedy_every - 1:
            ids = pool[torch.randint(0, pool.shape[0], (args.batch,), generator=gen).to(device)]
        else:
            ids = sample_windows(train_data, args.batch, length, gen)
        losses, accs = head_losses(head, target, ids, aux_layers, args.head_unroll)
        loss = sum(0.8**k * loss for k, loss in enumerate(losses))
        return loss, [x.detach() for x in losses + accs]

    trainable = [p for n, p in head.named_parameters() if not n.startswith("embed_tokens")]
    head.train()
    head_run = train_loop("head", trainable, args.head_steps, args, head_loss, device)
    head.eval()

    # Evaluation: held-out text, and the target's greedy continuations of held-out prompts.
    metrics = {"held_out": evaluate(target, head, eval_windows, aux_layers, args.head_unroll)}
    held_prompts = eval_windows[:64, : args.prompt_len]
    continued = greedy_generate(target, held_prompts, length - args.prompt_len)
    metrics["held_out_greedy_continuations"] = evaluate(
        target, head, continued, aux_layers, args.head_unroll, generated_from=args.prompt_len
    )
    sample = bytes(continued[0].tolist()).decode("utf-8", "replace")
    print(json.dumps(metrics, indent=2), flush=True)
    print("--- a held-out prompt and the target's greedy continuation ---\n" + sample, flush=True)

    out = args.out
    save_target_model(target.cpu(), out / "target")
    save_draft_model(head.cpu(), out / "eagle3", shared=("embed_tokens",))
    info = {
        "seed": args.seed,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "stdlib_root": str(root),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "aux_layers": list(aux_layers),
        "held_out_rule": f"file index % {HELD_OUT_EVERY} == {HELD_OUT_EVERY // 2} in the sorted list",
        "target_training": target_run,
        "head_training": head_run,
        "greedy_pool_seconds": gen_seconds,
        "metrics": metrics,
        "total_seconds": time.perf_counter() - t0,
        "train_files": train_files,
        "held_out_files": held_files,
    }
    (out / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"saved to {out} in {info['total_seconds']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
