"""The training unroll on the GPU (specdraft.training.unroll): a Llama-3-8B-sized
EAGLE-3 head (hidden 4096, 32 / 8 heads, 32k draft vocabulary of 128k), bf16, packed
sequences of 2048 tokens, K draft steps per chain start.

- eval: `unroll_for_eval` (draft tokens, no autograd), compiled fullgraph (the fused
  FlexAttention kernel) vs eager (dense attention, [T, T] scores per step);
- train: teacher-forced unroll + a logsumexp loss, forward and backward.

Chains per second (T chain starts, each K steps) and peak memory. Eager rows that do
not fit in memory say so.

    python benchmarks/bench_unroll.py [--k 7] [--sequences 1 2 8]
"""

import argparse
import time

import torch
from harness import device_name, emit, markdown_table

from specdraft.models import DraftModelConfig, Eagle3Head
from specdraft.training import unroll, unroll_for_eval

SEQ_LEN, DTYPE = 2048, torch.bfloat16


def make_head():
    cfg = DraftModelConfig(
        hidden_size=4096, intermediate_size=14336, num_heads=32, num_kv_heads=8, vocab_size=128256,
        draft_vocab_size=32000, rms_norm_eps=1e-5, rope_theta=500000.0, dtype=DTYPE,
    )  # fmt: skip
    torch.manual_seed(0)
    head = Eagle3Head(cfg).cuda()
    with torch.no_grad():
        for p in head.parameters():  # the default init is too wide for a 4096-wide bf16 stack
            if p.dim() > 1:
                p.normal_(std=0.02)
    return head


def packed(num_sequences: int):
    t = num_sequences * SEQ_LEN
    ids = torch.randint(0, 128256, (t,), dtype=torch.int32, device="cuda")
    hidden = torch.randn(t, 3 * 4096, device="cuda", dtype=DTYPE)
    positions = torch.arange(SEQ_LEN, device="cuda").repeat(num_sequences)
    cu = torch.arange(0, t + 1, SEQ_LEN, dtype=torch.int32, device="cuda")
    return ids, hidden, positions, cu


def measure(fn, reps: int = 3):
    """(median seconds, peak GiB) of fn(), after one warm-up call (compiles)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2], (torch.cuda.max_memory_allocated() - base) / 2**30


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 2, 8])
    args = parser.parse_args()
    head = make_head()
    k = args.k

    def eval_step(batch):
        return unroll_for_eval(head, *batch, num_steps=k)

    def loss(batch):
        out = unroll(head, *batch, num_steps=k, tokens="data")
        return (torch.logsumexp(out.logits.float(), -1) * out.valid).sum()

    def training_step(loss_fn):
        def step(batch):
            loss_fn(batch).backward()
            head.zero_grad(set_to_none=True)

        return step

    compiled_eval = torch.compile(eval_step, fullgraph=True)
    train_step, compiled_train = training_step(loss), training_step(torch.compile(loss, fullgraph=True))
    rows = []
    for s in args.sequences:
        batch = packed(s)
        t = s * SEQ_LEN
        for name, fn in (
            ("eval", eval_step),
            ("eval", compiled_eval),
            ("train", train_step),
            ("train", compiled_train),
        ):
            mode = "eager (dense)" if fn in (eval_step, train_step) else "compiled (flex)"
            try:
                seconds, peak = measure(lambda fn=fn, batch=batch: fn(batch))
                rows.append(
                    [name, mode, f"{s} x {SEQ_LEN}", k, f"{seconds * 1e3:.1f}", f"{t / seconds:.0f}", f"{peak:.1f}"]
                )
            except torch.OutOfMemoryError:
                rows.append([name, mode, f"{s} x {SEQ_LEN}", k, "OOM", "-", "-"])
            torch.cuda.empty_cache()
    table = markdown_table(["step", "mode", "T", "K", "ms", "chains/s", "peak GiB"], rows)
    emit("unroll", f"{device_name()}\n\n{table}")


if __name__ == "__main__":
    main()
