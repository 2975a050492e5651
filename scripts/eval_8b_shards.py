"""Write an 8B-shaped EAGLE-3 head (hidden 4096, 32 / 8 heads, 32k draft vocabulary
of 128k, bf16, random weights) and packed target shards with random outputs, for
timing `python -m specdraft.eval` at the size people train at. The metrics of random
weights mean nothing; the tokens/s and the compile time do.

    python scripts/eval_8b_shards.py OUT_DIR [--shards 4] [--sequences 2 3 1 4] [--seq-len 2048]
    python -m specdraft.eval OUT_DIR/head OUT_DIR/shards --device cuda --steps 7

--small writes a tiny head and shards instead (for a CPU check of this script).
"""

import argparse
from pathlib import Path

import torch

from specdraft.models import DraftModelConfig, Eagle3Head
from specdraft.models.loading import save_draft_model
from specdraft.training.shards import TargetBatch, save_batch

FULL = dict(hidden_size=4096, intermediate_size=14336, num_heads=32, num_kv_heads=8, vocab_size=128256,
            draft_vocab_size=32000, rope_theta=500000.0)  # fmt: skip
SMALL = dict(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, vocab_size=512,
             draft_vocab_size=128, rope_theta=10000.0)  # fmt: skip


def make_head(shape: dict) -> Eagle3Head:
    torch.manual_seed(0)
    head = Eagle3Head(DraftModelConfig(**shape, rms_norm_eps=1e-5, dtype=torch.bfloat16))
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() > 1:
                p.normal_(std=0.02)
        # An injective draft-to-target map: draft id i is target id 4 i (offsets d2t[i] = 3 i).
        head.d2t.copy_(torch.arange(head.d2t.shape[0]) * 3)
    return head


def make_batch(lengths: list[int], shape: dict, gen: torch.Generator) -> TargetBatch:
    """Random outputs, drawn on the generator's device (the GPU when there is one:
    128k-wide logits for thousands of rows take minutes on a CPU), saved from the host."""
    t, device = sum(lengths), gen.device
    logits = torch.randn(t, shape["vocab_size"], generator=gen, device=device, dtype=torch.bfloat16) * 2
    return TargetBatch(
        token_ids=torch.randint(0, shape["vocab_size"], (t,), generator=gen, device=device, dtype=torch.int32).cpu(),
        hidden_states=torch.randn(t, 3 * shape["hidden_size"], generator=gen, device=device).to(torch.bfloat16).cpu(),
        target_logits=logits.cpu(),
        positions=torch.cat([torch.arange(n) for n in lengths]),
        cu_seqlens=torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--sequences", type=int, nargs="+", default=[2, 3, 1, 4], help="sequences per shard")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    shape = SMALL if args.small else FULL
    save_draft_model(make_head(shape), args.out / "head")
    gen = torch.Generator("cuda" if torch.cuda.is_available() else "cpu").manual_seed(1)
    (args.out / "shards").mkdir(parents=True, exist_ok=True)
    for i, count in enumerate(args.sequences):
        # Lengths vary around seq_len, so the shards' T differ as real ones do.
        lengths = [args.seq_len - (args.seq_len // 20) * j for j in range(count)]
        save_batch(args.out / "shards" / f"shard_{i:03d}.safetensors", make_batch(lengths, shape, gen))
    print(f"wrote {args.out}/head and {len(args.sequences)} shards")


if __name__ == "__main__":
    main()
