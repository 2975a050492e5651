"""Budgeted verification projected onto a Llama-3-8B-shaped target, by batch size:
the demo pair's measured acceptance x the 8B-shaped model calls' measured times.

The target has all 32 decoder layers of Llama-3-8B's shape (bf16, random weights:
16 GB) and the draft is the 8B-shaped EAGLE-3 head (draft vocabulary 32000), as in
bench_generate.py. At each batch size B the script times, each captured alone in a
CUDA graph (eager kernels: 3 x 4 shapes per batch size would each compile the
32-layer target):

- the target's forward with its logits over n rows per request, n = 1 .. 4 (B n rows);
- the draft's first pass over the same windows, n = 2 .. 4;
- one single-token draft step.

An iteration's time is then the sum of its calls:

| configuration | verify pass | draft |
|---|---|---|
| plain | n = 1 | none |
| fixed K = 1 | n = 2 | first pass over n = 2 |
| fixed K = 3 | n = 4 | first pass over n = 4, 2 steps |
| budget fB, K = 3 drafted (f = 1, 2, 3) | B + fB rows (packed; timed as n = f + 1) | first pass over the same rows, 2 steps |

and its projected decode rate is B x (tokens per request and iteration) / that time,
the tokens taken from the demo pair's `budget` table (bench_budget.py: the newest
row of each configuration on --acceptance-device, greedy; plain decoding is 1). A
budgeted pass always holds B + budget rows (one compiled shape), so its target cost
is the uniform pass of the same rows; the packed attention's ragged windows and
the allocation op (10.6 µs at B = 256, bench_budget_keep.py) are not in it, nor is
any iteration's bookkeeping (the demo pair's iterations run within 1.02-1.03x of
their floor, bench_generate.py). What it shows: where the target's pass grows with
the rows it verifies, whether a budget picks better than every fixed K.

    python3 benchmarks/bench_budget_8b.py                       # GPU: B = 1, 4, 16, 64, 256
    python3 benchmarks/bench_budget_8b.py --smoke               # CPU, tiny sizes: a check of the script

Rows go to the tables `budget_8b_calls` (the calls' µs) and `budget_8b` (the
projection); not with --smoke.
"""

import argparse
import json

import torch
from bench_generate import BLOCK_SIZE, Device, build_8b, floor_fns, log, table
from record import RESULTS, append_table, latest, read_rows

from specdraft.config import SpeculativeConfig
from specdraft.generation import SpeculativeDecoder, num_kv_blocks
from specdraft.proposers import EagleProposer

K = 3
BATCH_SIZES = [1, 4, 16, 64, 256]  # where the demo pair's budget table has every configuration
PROMPT_LEN = 128
MAX_MODEL_LEN = 256
FIXED = (1, 3)
BUDGET_FRACTIONS = (1, 2, 3)


def time_calls(dev: Device, target, head, num_reqs: int) -> dict:
    """µs of the target's forward at n = 1 .. K + 1 rows per request, the draft's first
    pass at n = 2 .. K + 1, and one draft step, at B = num_reqs."""
    config = SpeculativeConfig(method="eagle3", num_speculative_tokens=K, max_model_len=MAX_MODEL_LEN,
                               block_size=BLOCK_SIZE)  # fmt: skip
    caches = head.allocate_kv_caches(num_kv_blocks(num_reqs, MAX_MODEL_LEN, K, BLOCK_SIZE), BLOCK_SIZE)
    decoder = SpeculativeDecoder(target, EagleProposer(head, config, caches), compile=False)
    gen = torch.Generator().manual_seed(num_reqs)
    vocab = target.config.vocab_size
    prompts = [torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist() for _ in range(num_reqs)]
    prompts, requests = decoder.requests(prompts, 16, None, None)
    calls = {}
    with torch.no_grad():
        state = decoder.prefill(prompts, requests)
        for rows in range(1, K + 2):
            target_fn, first_fn, step_fn = floor_fns(dev, decoder, state, requests, rows, compile=False)
            calls[f"target_{rows}"] = dev.time_us(target_fn, graph=True)
            if rows > 1:
                calls[f"first_pass_{rows}"] = dev.time_us(first_fn, graph=True)
        calls["draft_step"] = dev.time_us(step_fn, graph=True)
    del decoder, caches, state
    if not dev.smoke:
        torch.cuda.empty_cache()
    return calls


def acceptance_table(device_name: str) -> dict:
    """(B, mode, k, budget) -> tokens per request and iteration, from the newest greedy
    rows of the demo pair's `budget` table on that device."""
    rows = [r for r in latest(read_rows("budget", RESULTS)) if r["device"] == device_name]
    return {(r["config"]["B"], r["config"]["mode"], r["config"].get("k"), r["config"].get("budget")):
            r["metrics"]["acceptance_length"] for r in rows}  # fmt: skip


def drafted_iteration_us(calls: dict, rows: int, drafts: int) -> float:
    """A speculative iteration verifying `rows` rows per request and drafting `drafts`
    tokens: the target's pass, the draft's first pass over the same rows, and the
    draft steps after it."""
    return calls[f"target_{rows}"] + calls[f"first_pass_{rows}"] + (drafts - 1) * calls["draft_step"]


def configurations(num_reqs: int, calls: dict):
    """(name, mode, k, budget, µs of one iteration) per configuration (module docstring)."""
    yield "plain", "plain", 0, None, calls["target_1"]
    for k in FIXED:
        yield f"fixed K = {k}", "fixed", k, None, drafted_iteration_us(calls, k + 1, k)
    for fraction in BUDGET_FRACTIONS:
        yield f"budget {fraction}B", "budget", K, fraction * num_reqs, drafted_iteration_us(calls, fraction + 1, K)


def projection(num_reqs: int, calls: dict, accepted: dict) -> list[list]:
    """Rows [B, configuration, µs per iteration, tokens per request and iteration, projected
    tokens/s, / best of plain and fixed K]; configurations without a demo-pair row skipped."""
    rows = []
    for name, mode, k, budget, time_us in configurations(num_reqs, calls):
        tokens = 1.0 if mode == "plain" else accepted.get((num_reqs, mode, k, budget))
        if tokens is None:
            log(f"B = {num_reqs}: no demo-pair row for {name}; skipped")
            continue
        rows.append([num_reqs, name, time_us, tokens, num_reqs * tokens / (time_us * 1e-6)])
    best_fixed = max((r[4] for r in rows if not r[1].startswith("budget")), default=float("nan"))
    return [r + [r[4] / best_fixed] for r in rows]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=BATCH_SIZES)
    parser.add_argument("--layers", type=int, default=32, help="decoder layers of the target (of 32)")
    parser.add_argument("--acceptance-device", default="NVIDIA H200",
                        help="the device whose demo-pair budget rows give the acceptance")  # fmt: skip
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", help="write the calls and the projection as JSON")
    args = parser.parse_args(argv)
    dev = Device(args.smoke)
    target, head = build_8b(dev, 2 if args.smoke else args.layers, 256 if args.smoke else 32000)
    batch_sizes = [1, 4] if args.smoke else args.batch_sizes
    accepted = acceptance_table(args.acceptance_device)
    call_rows, rows = [], []
    for num_reqs in batch_sizes:
        calls = time_calls(dev, target, head, num_reqs)
        log(f"B = {num_reqs}: " + ", ".join(f"{name} {us:.0f} µs" for name, us in calls.items()))
        call_rows.append([num_reqs, *calls.values()])
        rows += projection(num_reqs, calls, accepted)
    call_headers = ["B", *(f"{name} µs" for name in calls)]
    headers = ["B", "configuration", "µs per iteration", "tokens per request and iteration", "projected tokens/s",
               "/ best of plain and fixed K"]  # fmt: skip
    config = {"target": f"8B-shaped, {args.layers} of 32 layers", "draft": "8B-shaped EAGLE-3", "K drafted": K,
              "calls": "eager, CUDA graph", "acceptance": f"demo pair budget table, {args.acceptance_device}"}  # fmt: skip
    if not dev.smoke:
        append_table("budget_8b_calls", call_headers, call_rows, config_columns=1, config=config)
        append_table("budget_8b", headers, rows, config_columns=2, config=config)
    print(table(call_headers, call_rows))
    print()
    print(table(headers, rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calls": call_rows, "projection": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
