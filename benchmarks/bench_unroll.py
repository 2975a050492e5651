"""The training unroll on the GPU (specdraft.training.unroll): a Llama-3-8B-sized
EAGLE-3 head (hidden 4096, 32 / 8 heads, 32k draft vocabulary of 128k), bf16, packed
sequences of 2048 tokens, K draft steps per chain start.

- eval: `unroll_for_eval` (draft tokens, no autograd), compiled fullgraph (the fused
  FlexAttention kernel) vs eager (dense attention, [T, T] scores per step);
- train: teacher-forced unroll + a logsumexp loss, forward and backward.

S in {1, 2, 8} sequences, in one process, each compiled function built once with
dynamic=True: the recompiles column counts Dynamo frames compiled for that row (the
first row of each compiled step holds its one compile). Chains per second (T chain
starts, each K steps), median ms of 3 calls after a warm-up, and peak memory above
the inputs. A row that fails records its error class and the bench goes on.

    python benchmarks/bench_unroll.py [--k 7] [--sequences 1 2 8] [--json out.json]
"""

import argparse
import json
import time

import torch
from harness import device_name, emit, markdown_table
from record import append_table

from specdraft.models import DraftModelConfig, Eagle3Head
from specdraft.testing import CompileCounts
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
    """(median seconds, peak GiB above what was allocated before, Dynamo frames
    compiled) of fn(), after one warm-up call (which compiles)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with CompileCounts.measure() as counts:
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    return sorted(times)[len(times) // 2], peak, counts.compiles


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--json", help="also write the rows as JSON")
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

    # dynamic=True: one graph for every T and sequence count (see docs/usage.md).
    compiled_eval = torch.compile(eval_step, fullgraph=True, dynamic=True)
    compiled_loss = torch.compile(loss, fullgraph=True, dynamic=True)
    steps = {
        ("eval", "eager (dense)"): eval_step,
        ("eval", "compiled (flex)"): compiled_eval,
        ("train", "eager (dense)"): training_step(loss),
        ("train", "compiled (flex)"): training_step(compiled_loss),
    }
    rows, records = [], []
    for s in args.sequences:
        batch = packed(s)
        t = s * SEQ_LEN
        for (name, mode), fn in steps.items():
            record = {"step": name, "mode": mode, "sequences": s, "tokens": t, "k": k}
            try:
                seconds, peak, compiles = measure(lambda fn=fn, batch=batch: fn(batch))
                record.update(ms=seconds * 1e3, chains_per_s=t / seconds, peak_gib=peak, compiles=compiles)
                cells = [f"{seconds * 1e3:.1f}", f"{t / seconds:.0f}", f"{peak:.1f}", str(compiles)]
            except torch.OutOfMemoryError:
                record["error"] = "OutOfMemoryError"
                cells = ["OOM", "-", "-", "-"]
            except Exception as error:  # noqa: BLE001 - the table records it and goes on
                record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                cells = [type(error).__name__, "-", "-", "-"]
                print(f"row {name} / {mode} / S={s} failed: {record['error']}", flush=True)
            head.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            records.append(record)
            rows.append([name, mode, f"{s} x {SEQ_LEN}", k, *cells])
            print(rows[-1], flush=True)
    ratio_rows = []
    for s in args.sequences:
        for name in ("eval", "train"):
            eager = next(r for r in records if r["sequences"] == s and r["step"] == name and "eager" in r["mode"])
            comp = next(r for r in records if r["sequences"] == s and r["step"] == name and "compiled" in r["mode"])
            speedup = f"{eager['ms'] / comp['ms']:.2f}x" if "ms" in eager and "ms" in comp else "-"
            memory = f"{comp['peak_gib'] / eager['peak_gib']:.2f}" if "ms" in eager and "ms" in comp else "-"
            ratio_rows.append([name, f"{s} x {SEQ_LEN}", speedup, memory])
    headers = ["step", "mode", "T", "K", "ms", "chains/s", "peak GiB", "compiles"]
    table = markdown_table(headers, rows)
    ratios = markdown_table(["step", "T", "compiled speedup", "compiled / eager peak"], ratio_rows)
    emit("unroll", f"{device_name()}\n\n{table}\n\n{ratios}")
    append_table("unroll", headers, rows, config_columns=4)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
