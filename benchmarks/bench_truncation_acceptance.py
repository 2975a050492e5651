"""Drafting inside a request's truncation against drafting outside it (issue 40,
proof 5): the acceptance length of the demo pair (the shipped 4 x 256 byte-level
target and its EAGLE-3 head, a K = 3 chain, the demo's drafter) at temperature 0.7
with top-p 0.9, and with top-p 0.9 + top-k 20.

Drafts are sampled (draft_sampling="probabilistic", return_probs="probs"), either
inside the truncation (SpeculativeConfig.draft_truncation=True, the default: the
draft's distribution truncated by the request's parameters and renormalised) or
outside it (draft_truncation=False: the untruncated draft distribution, vLLM's
way). Verification truncates the target either way, so both emit the same
distribution; only how often the drafts are accepted differs. A third row per
setting drafts greedily (the demo's own drafts: the draft's argmax is always inside
the truncation, so there the two coincide), for reference.

Requests: the demo's prompts, each decoded under --seeds seeds (request seed
SEED_BASE + 1000 * s + prompt index, the same for every row), --max-new-tokens
each, in batches of --batch-seeds seeds (prompts x batch-seeds requests; a
request's tokens do not depend on its batch: its noise is keyed by its seed and
positions). A seed's acceptance length is its
requests' tokens per request pass (bonus included, as the demo reports it: 1 +
accepted drafts / request passes over the seed's requests). Reported per row: the
mean over seeds and its standard error, and for drafting inside the paired
difference inside - outside (the same seed and prompts) with its standard error.

    python benchmarks/bench_truncation_acceptance.py --device cpu      # this table's CPU rows
    python benchmarks/bench_truncation_acceptance.py                   # CUDA when there is one
    python benchmarks/bench_truncation_acceptance.py --smoke           # 2 seeds x 16 tokens: checks the script

Each kind of drafts compiles its iteration once, with the demo's options (on CPU
that is faster over the whole run than eager, --eager), in a first call of 2 tokens;
the seconds reported are the timed runs'. Rows go to the `truncation_acceptance`
table (benchmarks/record.py; not with --smoke).

Why 64 tokens and 96 seeds by default: the demo's snippets start looping after a
while, where the drafts are nearly certain and the truncation rarely binds, and the
prefill of each request is a fixed cost; over the first 64 tokens the difference is
larger and more seeds fit the same time. The trajectories inside and outside part
after their first differing draft, so the pairing removes little of the noise.
"""

import argparse
import math
import sys
import time

import torch
from record import append_rows

from specdraft.assets import load_demo_pair
from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.demo import BLOCK_SIZE, DEFAULT_K, PROMPTS, TEMPERATURE, compile_options, encode
from specdraft.generation import SpeculativeDecoder, num_kv_blocks
from specdraft.proposers import EagleProposer

SETTINGS = ({"top_k": 0, "top_p": 0.9}, {"top_k": 20, "top_p": 0.9})
DRAFTS = ("inside", "outside", "greedy")
SEED_BASE = 4000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_decoder(target, head, drafts: str, num_reqs: int, max_model_len: int, compile) -> SpeculativeDecoder:
    """The EAGLE-3 chain (K = the demo's) drafting `drafts`: "inside" / "outside"
    the truncation (sampled drafts), or "greedy"."""
    sampled = drafts != "greedy"
    config = SpeculativeConfig(
        method="eagle3", num_speculative_tokens=DEFAULT_K, max_model_len=max_model_len, block_size=BLOCK_SIZE,
        draft_sampling="probabilistic" if sampled else "greedy", return_probs="probs" if sampled else None,
        draft_truncation=drafts != "outside",
    )  # fmt: skip
    caches = head.allocate_kv_caches(num_kv_blocks(num_reqs, max_model_len, DEFAULT_K, BLOCK_SIZE), BLOCK_SIZE)
    return SpeculativeDecoder(target, EagleProposer(head, config, caches), compile=compile)


def sampling_for(setting: dict, num_prompts: int, seeds: range) -> SamplingParams:
    """Request j * num_prompts + i: prompt i under the j-th of `seeds`."""
    num = num_prompts * len(seeds)
    seeds = torch.tensor([SEED_BASE + 1000 * s + i for s in seeds for i in range(num_prompts)])
    return SamplingParams(torch.full((num,), TEMPERATURE), seeds, top_k=torch.full((num,), setting["top_k"]),
                          top_p=torch.full((num,), setting["top_p"]))  # fmt: skip


def per_seed_lengths(parts: list, num_prompts: int) -> list[float]:
    """Each seed's acceptance length over the batches' stats: 1 + its requests'
    accepted drafts / request passes."""
    accepted = torch.cat([stats.accepted_per_request for stats in parts]).view(-1, num_prompts).sum(1).double()
    passes = torch.cat([stats.request_passes for stats in parts]).view(-1, num_prompts).sum(1).double()
    return (1 + accepted / passes).tolist()


def mean_and_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def label(setting: dict) -> str:
    top_k = f", top-k {setting['top_k']}" if setting["top_k"] > 0 else ""
    return f"T = {TEMPERATURE}, top-p {setting['top_p']}{top_k}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seeds", type=int, default=96, help="seeds per prompt (default 96)")
    parser.add_argument("--batch-seeds", type=int, default=16, help="seeds per batch (default 16: 96 requests; "
                        "must divide --seeds)")  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=64, help="per request (default 64; the demo's: 160)")
    parser.add_argument("--drafts", nargs="+", choices=DRAFTS, default=list(DRAFTS[:2]), help="the rows per "
                        "setting (default: inside outside; greedy adds the demo's greedy drafts)")  # fmt: skip
    parser.add_argument("--eager", action="store_true", help="do not compile the iterations")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument("--smoke", action="store_true", help="2 seeds (2 batches) x 16 tokens, eager, nothing "
                        "recorded: checks the script")  # fmt: skip
    args = parser.parse_args(argv)
    if args.seeds < 2 or args.max_new_tokens < 2:
        parser.error("--seeds and --max-new-tokens must be >= 2")
    if args.batch_seeds < 1 or args.seeds % args.batch_seeds:
        parser.error(f"--batch-seeds must divide --seeds ({args.seeds}), got {args.batch_seeds}")
    seeds, max_new, per_batch = (2, 16, 1) if args.smoke else (args.seeds, args.max_new_tokens, args.batch_seeds)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    compile = compile_options(device.type, not (args.eager or args.smoke))
    prompts = encode(PROMPTS)
    num_reqs = len(prompts) * per_batch
    max_model_len = max(len(p) for p in prompts) + max_new + DEFAULT_K + 1
    target, head = load_demo_pair(device=device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name} (torch {torch.__version__}); demo pair, EAGLE-3 chain K = {DEFAULT_K}; {len(prompts)} prompts x "
          f"{seeds} seeds, in batches of {num_reqs} requests, {max_new} new tokens each; "
          f"{'compiled' if compile else 'eager'}\n")  # fmt: skip
    headers = ["sampling", "drafts", "acceptance length (mean over seeds)", "SE", "inside - outside (paired)", "SE",
               "request passes", "seconds"]  # fmt: skip
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    start, results = time.perf_counter(), {}
    drafts_run = [d for d in DRAFTS if d in args.drafts]
    for drafts in drafts_run:  # one decoder per kind of drafts: the settings' values are tensors, one graph serves both
        decoder = make_decoder(target, head, drafts, num_reqs, max_model_len, compile)
        t0 = time.perf_counter()  # compile (or warm up) the iteration: max_new_tokens changes no shape
        first = range(per_batch)
        decoder.generate(prompts * per_batch, max_new_tokens=2, sampling=sampling_for(SETTINGS[0], len(prompts), first))
        log(f"{drafts}: {'compile' if compile else 'warm-up'} {time.perf_counter() - t0:.0f} s")
        for setting in SETTINGS:
            t0, parts = time.perf_counter(), []
            for begin in range(0, seeds, per_batch):
                sampling = sampling_for(setting, len(prompts), range(begin, begin + per_batch))
                parts.append(decoder.generate(prompts * per_batch, max_new_tokens=max_new, sampling=sampling).stats)
            results[label(setting), drafts] = (parts, time.perf_counter() - t0)
            log(f"{label(setting)}, {drafts}: {time.perf_counter() - start:.0f} s")
    rows = []
    for setting in SETTINGS:
        lengths = {d: per_seed_lengths(results[label(setting), d][0], len(prompts)) for d in drafts_run}
        for drafts in drafts_run:
            parts, seconds = results[label(setting), drafts]
            mean, se = mean_and_se(lengths[drafts])
            metrics = {"acceptance_length": mean, "acceptance_length_se": se}
            if drafts == "inside" and "outside" in lengths:
                paired = [a - b for a, b in zip(lengths["inside"], lengths["outside"], strict=True)]
                metrics["inside_minus_outside"], metrics["inside_minus_outside_se"] = mean_and_se(paired)
            passes = sum(int(stats.request_passes.sum()) for stats in parts)
            metrics.update(per_seed_acceptance_length=lengths[drafts], request_passes=passes, seconds=seconds)
            config = {**setting, "temperature": TEMPERATURE, "drafts": drafts, "K": DEFAULT_K,
                      "prompts": len(prompts), "seeds": seeds, "batch": num_reqs, "max_new_tokens": max_new,
                      "compiled": bool(compile)}  # fmt: skip
            rows.append({"config": config, "metrics": metrics})
            diff, diff_se = metrics.get("inside_minus_outside"), metrics.get("inside_minus_outside_se")
            difference = ["", ""] if diff is None else [f"{diff:+.4f}", f"{diff_se:.4f}"]
            cells = [label(setting), drafts, f"{mean:.4f}", f"{se:.4f}", *difference, passes, f"{seconds:.1f}"]
            print("| " + " | ".join(str(c) for c in cells) + " |")
    print()
    for setting in SETTINGS:
        found = {r["config"]["drafts"]: r["metrics"] for r in rows if r["config"]["top_k"] == setting["top_k"]}
        if "inside" not in found or "outside" not in found:
            continue
        inside, outside = found["inside"], found["outside"]
        diff, diff_se = inside["inside_minus_outside"], inside["inside_minus_outside_se"]
        verdict = "inside >= outside" if diff >= 0 else "inside < outside"
        print(f"{label(setting)}: inside {inside['acceptance_length']:.4f} ± {inside['acceptance_length_se']:.4f}, "
              f"outside {outside['acceptance_length']:.4f} ± {outside['acceptance_length_se']:.4f}; paired "
              f"difference {diff:+.4f} ± {diff_se:.4f} ({diff / diff_se:+.1f} SE): {verdict}")  # fmt: skip
    if not args.smoke:
        append_rows("truncation_acceptance", [(r["config"], r["metrics"]) for r in rows], device=name)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
