"""Draft-model layer on the GPU: the pure-torch paged attention (eager and
torch.compile) against dense SDPA on pre-gathered keys as the yardstick, and one
EAGLE-3 decode step (Llama-3-8B-sized head: hidden 4096, 32/8 heads, 32k draft
vocabulary of 128k) eager vs torch.compile(fullgraph=True).

    python benchmarks/bench_models.py
"""

import torch
import torch.nn.functional as F
from harness import compiled, device_name, emit, markdown_table, time_us
from record import append_table

from specdraft.layout import BatchMetadata
from specdraft.models import DraftModelConfig, Eagle3Head, paged_attention

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
DTYPE = torch.bfloat16


def decode_batch(batch: int, seq_len: int):
    """batch requests of seq_len cached tokens, one query each, blocks laid out shuffled."""
    width = seq_len // BLOCK
    blocks = torch.randperm(batch * width, device="cuda").view(batch, width).to(torch.int32)
    cache = torch.randn(2, batch * width, BLOCK, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    md = BatchMetadata(
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        seq_lens=torch.full((batch,), seq_len, dtype=torch.int32, device="cuda"),
        block_table=blocks,
        slot_mapping=(blocks[:, -1].long() * BLOCK + BLOCK - 1),
        max_query_len=1,
        max_seq_len=seq_len,
    )
    return cache, md


def bench_attention(rows):
    for batch, seq_len in ((8, 512), (64, 512), (64, 2048)):
        cache, md = decode_batch(batch, seq_len)
        q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)

        def run(q=q, cache=cache, md=md):
            return paged_attention(q, cache, md.query_start_loc, md.seq_lens, md.block_table, 1, md.max_seq_len)

        # Yardstick: the same attention on keys already dense and contiguous.
        k = torch.randn(batch, HEADS, seq_len, HEAD_DIM, device="cuda", dtype=DTYPE)
        v = torch.randn_like(k)
        qd = q[:, :, None, :]
        rows.append([f"B={batch} L={seq_len}", time_us(run), time_us(compiled(run)),
                     time_us(lambda qd=qd, k=k, v=v: F.scaled_dot_product_attention(qd, k, v))])  # fmt: skip
        torch._dynamo.reset()


def bench_eagle3(rows):
    cfg = DraftModelConfig(
        hidden_size=4096, intermediate_size=14336, num_heads=HEADS, num_kv_heads=KV_HEADS, vocab_size=128256,
        draft_vocab_size=32000, rms_norm_eps=1e-5, rope_theta=500000.0, dtype=DTYPE,
    )  # fmt: skip
    head = Eagle3Head(cfg).cuda().eval()
    for batch, seq_len in ((8, 512), (64, 2048)):
        cache, md = decode_batch(batch, seq_len)
        ids = torch.randint(0, cfg.vocab_size, (batch,), dtype=torch.int32, device="cuda")
        pos = torch.full((batch,), seq_len - 1, device="cuda")
        hidden = torch.randn(batch, 4096, device="cuda", dtype=DTYPE)

        def step(ids=ids, pos=pos, hidden=hidden, md=md, cache=cache):
            out, nxt = head(ids, pos, hidden, md, [cache])
            return head.compute_draft_logits(out).argmax(-1), nxt

        with torch.no_grad():
            rows.append([f"B={batch} L={seq_len}", time_us(step), time_us(compiled(step))])
        torch._dynamo.reset()


def main():
    if not torch.cuda.is_available():
        print("bench_models: needs a CUDA device")
        return
    print(f"# {device_name()}\n")
    attn = []
    bench_attention(attn)
    headers = ["batch", "eager µs", "torch.compile µs", "dense SDPA (yardstick) µs"]
    emit("models_paged_attention", "## Paged attention, decode (bf16, 32/8 heads, head_dim 128, block 16)\n\n"
         + markdown_table(headers, attn))  # fmt: skip
    append_table("models_paged_attention", headers, attn, config_columns=1)
    head = []
    bench_eagle3(head)
    headers = ["batch", "eager µs", "torch.compile µs"]
    emit("models_eagle3_step", "## EAGLE-3 head decode step (8B-sized, bf16, draft-vocab argmax)\n\n"
         + markdown_table(headers, head))  # fmt: skip
    append_table("models_eagle3_step", headers, head, config_columns=1)


if __name__ == "__main__":
    main()
