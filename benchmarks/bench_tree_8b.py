"""Draft trees and chains on a Llama-3-8B-shaped target, B = 1: what a pass costs
and what a tree would buy on a model whose forward dominates.

The target has all 32 decoder layers of Llama-3-8B's shape (bf16, random weights,
hidden 4096, 32 / 8 heads, intermediate 14336, vocab 128256: 16 GB) and the draft is
the 8B-shaped EAGLE-3 head (draft vocabulary 32000). Random weights accept nothing
worth measuring, so acceptance lengths come from the demo pair's measured table
(--acceptance: the `tree` table of benchmarks/results, or bench_tree.py --json files;
default: the table's greedy compiled rows, newest last). Three
tables:

1. target verify: the target's forward (with its logits) over N tokens of one
   request, with the tree's ancestor mask (N = D + 1 for the chains, 16, 32, 64), and
   the 1-token step of plain decoding; each compiled and captured alone.
2. iteration against floor: the whole compiled iteration (verify, accept, commit,
   propose; mode="reduce-overhead": one CUDA graph) against the floor = the target's
   forward over the verified tokens + the draft's first pass + (D - 1) draft steps
   (a chain step: 1 token; a tree step: the topk frontier nodes with their tree
   attention), each captured alone.
3. projected 8B speedup = acceptance length (demo pair) x plain iteration time /
   speculative iteration time.

    python3 benchmarks/bench_tree_8b.py                   # GPU
    python3 benchmarks/bench_tree_8b.py --smoke           # CPU, tiny sizes, aot_eager: a check of the script

Configurations run in order of importance under --budget-s (each compiles the
32-layer target for its own shapes); the rest are printed as skipped.
"""

import argparse
import json
import pathlib
import time
from statistics import median

import torch
from bench_generate import BLOCK_SIZE, Budget, Device, build_8b, floor_fns, kernel_list, log, table, warmed_iteration
from bench_tree import drafts_of
from record import RESULTS, append_rows, read_rows, table_path

from specdraft.config import SpeculativeConfig
from specdraft.generation import SpeculativeDecoder, TreeSpeculativeDecoder, num_kv_blocks
from specdraft.generation.verify import tree_batch, window_batch
from specdraft.proposers import EagleProposer
from specdraft.proposers.tree import empty_buffers, feed_frontier

DEFAULT_ACCEPTANCE = [table_path("tree", RESULTS)]
MAX_MODEL_LEN = 1024
PROMPT_LEN = 128
CONFIGS = ["5,1,6", "7,4,32", "5,4,32", "3,1,4", "7,1,8", "5,4,16", "7,4,16", "3,4,16"]


def load_acceptance(paths) -> dict:
    """(depth, topk, N) -> acceptance length, from `tree` tables (.jsonl: their greedy,
    compiled rows) or bench_tree.py JSON files; a later row replaces an earlier one."""
    lengths = {}
    for path in map(pathlib.Path, paths):
        if path.suffix == ".jsonl":
            rows = [{**r["config"], **r["metrics"]} for r in read_rows(path.stem, path.parent)]
            rows = [r for r in rows if r["temperature"] == 0 and not r["eager"]]
        else:
            rows = json.loads(path.read_text())["rows"]
        for row in rows:
            lengths[(row["depth"], row["topk"], row["N"])] = row["acceptance_length"]
    return lengths


def four_ary_tree(n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(parents, depths) [1, n] of a tree of n nodes, node i's parent (i - 1) // 4:
    the verify table's mask (its cost hardly depends on the mask's pattern)."""
    parents = [-1] + [(i - 1) // 4 for i in range(1, n)]
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    as_tensor = lambda v: torch.tensor([v], dtype=torch.int64, device=device)  # noqa: E731
    return as_tensor(parents), as_tensor(depths)


def tree_target_fn(decoder, lens, parents, depths, block_table):
    """The target's forward with logits over one tree per request (the verify pass
    of TreeSpeculativeDecoder.verify, without the walk and the commit)."""
    num_reqs, n = parents.shape
    tokens = torch.randint(0, decoder.target.config.vocab_size, (num_reqs * n,), device=lens.device, dtype=torch.int32)
    positions, metadata = tree_batch(lens, parents, depths, block_table, decoder.block_size, decoder.reach,
                                     decoder.max_model_len)  # fmt: skip
    positions = positions.reshape(-1)

    def target_forward():
        hidden, aux = decoder.run_target(tokens, positions, metadata)
        return decoder.target.compute_logits(hidden), aux

    return target_forward


def tree_floor_fns(dev: Device, decoder, state, requests):
    """(target forward over the tree, the draft's first pass over depth + 1 rows, one
    tree step of topk frontier nodes with their logits), each compiled alone."""
    tree, head = decoder.tree, decoder.proposer.model
    caches, width = decoder.proposer.kv_caches, tree.depth + 1
    target_forward = tree_target_fn(decoder, state.lens, state.tree_parents, state.tree_depths, requests.block_table)
    positions, metadata = window_batch(state.lens, width, requests.block_table, decoder.block_size, decoder.reach)
    token_ids = torch.cat([state.last_tokens[:, None], state.drafts[:, : width - 1]], dim=1).reshape(-1)
    _, aux = decoder.run_target(token_ids, positions, metadata)
    aux = aux.clone()
    rows = metadata.query_start_loc[1:].long() - 1

    def first_pass():
        h_sample, h_next = head(token_ids, positions, aux, metadata, caches)
        return head.compute_logits(h_sample.index_select(0, rows)), h_next.index_select(0, rows)

    batch = state.lens.shape[0]
    fed = state.drafts[:, : tree.topk].long()
    hidden = torch.zeros(batch * tree.topk, head.config.hidden_size, dtype=aux.dtype, device=aux.device)
    node_pos = (state.lens + 1).repeat_interleave(tree.topk)
    buffers = empty_buffers(head, caches, batch, tree)
    slots = (tree.depth - 1) * tree.topk
    visible = torch.zeros(batch, tree.topk, slots, dtype=torch.bool, device=aux.device)
    lane = torch.arange(tree.topk, device=aux.device)
    visible[:, lane, lane] = True

    def tree_step():
        # The window's batch: seq_lens count each root, as the roots' step batch does.
        h_sample, h_next = feed_frontier(head, caches, fed, hidden, node_pos, 1, dict(buffers), visible, metadata)
        return head.draft_logits(h_sample, 1).argmax(-1), h_next

    fns = [target_forward, first_pass] + ([tree_step] if tree.depth > 1 else [])
    return [dev.compile_alone(fn) for fn in fns]


def build_decoder(target, head, depth: int, tree, dev: Device):
    """plain (depth 0), chain or tree decoder for one request."""
    if depth == 0:
        return SpeculativeDecoder(target, None, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
                                  compile=dev.iteration_compile)  # fmt: skip
    config = SpeculativeConfig(method="eagle3", num_speculative_tokens=depth, max_model_len=MAX_MODEL_LEN,
                               block_size=BLOCK_SIZE)  # fmt: skip
    reach = depth if tree is None else tree.num_verify_tokens - 1
    caches = head.allocate_kv_caches(num_kv_blocks(1, MAX_MODEL_LEN, reach, BLOCK_SIZE), BLOCK_SIZE)
    proposer = EagleProposer(head, config, caches)
    if tree is None:
        return SpeculativeDecoder(target, proposer, compile=dev.iteration_compile)
    return TreeSpeculativeDecoder(target, proposer, tree, compile=dev.iteration_compile)


def warm_iteration(dev: Device, decoder, prompt, profile: bool = False):
    """(iteration fn, state, requests): the compiled iteration, B = 1, compiled, warmed
    up and its graph recorded; profile: also log its kernels (kernel_list)."""
    prompts, requests = decoder.requests([prompt], MAX_MODEL_LEN - len(prompt), None, None)
    state = decoder.prefill(prompts, requests)
    iteration = warmed_iteration(dev, decoder, state, requests)
    if profile and not dev.smoke:
        log(f"kernels of one iteration ({type(decoder).__name__}, K = {decoder.k}):\n" + kernel_list(iteration))
    return iteration, state, requests


def interleaved_us(dev: Device, fns: dict, rounds: int) -> dict[str, list[float]]:
    """µs of each (fn, graph) in `fns`, timed one after another in each of `rounds`
    rounds: a drift of the GPU's speed over the minutes a configuration takes then
    moves the iteration and its floor pieces alike (two calls' floor pieces, each
    timed once, differed by 9%)."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, (fn, graph) in fns.items():
            times[name].append(dev.time_us(fn, graph=graph))
    return times


def verify_section(dev: Device, target, sizes) -> tuple[str, dict]:
    decoder = build_decoder(target, None, 0, None, dev)
    _, requests = decoder.requests([[1] * PROMPT_LEN], 8, None, None)
    lens = torch.full((1,), PROMPT_LEN, dtype=torch.int64, device=dev.name)
    times = {}
    with torch.no_grad():
        for n in sizes:
            parents, depths = four_ary_tree(n, dev.name)
            fn = dev.compile_alone(tree_target_fn(decoder, lens, parents, depths, requests.block_table))
            times[n] = dev.time_us(fn, graph=True)
            log(f"verify N={n}: {times[n]:.0f} µs")
    rows = [[n, times[n], times[n] / times[min(sizes)]] for n in sizes]
    text = (
        f"Target forward with logits over N tree tokens of one request (prefix {PROMPT_LEN}; 4-ary tree mask), "
        "compiled and captured alone\n\n" + table(["N", "target fwd µs", f"vs N = {min(sizes)}"], rows)
    )
    return text, times


def iteration_section(dev: Device, budget: Budget, target, head, configs, acceptance, profile=False,
                      rounds: int = 3) -> dict:  # fmt: skip
    """Plain decoding's iteration, then each configuration's iteration against its
    floor (medians over `rounds` interleaved rounds, and the per-round ratios'
    median and range), printed as a table; returns the numbers."""
    prompt = torch.randint(0, target.config.vocab_size, (PROMPT_LEN,), generator=torch.Generator().manual_seed(0))
    rows, out = [], {"rows": []}
    with torch.no_grad():
        torch._dynamo.reset()
        plain_fn, _, _ = warm_iteration(dev, build_decoder(target, head, 0, None, dev), prompt.tolist())
        plain_us = median(interleaved_us(dev, {"plain": (plain_fn, False)}, rounds)["plain"])
        log(f"plain: {plain_us:.0f} µs per token ({budget.spent():.0f} s)")
        for text in configs:
            depth, tree = drafts_of(text)
            topk, n = (1, depth + 1) if tree is None else (tree.topk, tree.num_verify_tokens)
            label = ["chain" if tree is None else "tree", depth, topk, n]
            if budget.over():
                rows.append(label + ["skipped (budget)"] + [""] * 7)
                continue
            torch._dynamo.reset()  # every decoder compiles the same iteration code (recompile limit 8)
            t0 = time.perf_counter()
            decoder = build_decoder(target, head, depth, tree, dev)
            iteration_fn, state, requests = warm_iteration(dev, decoder, prompt.tolist(), profile)
            if tree is None:
                target_fn, first_fn, step_fn = floor_fns(dev, decoder, state, requests)
            else:
                target_fn, first_fn, *step = tree_floor_fns(dev, decoder, state, requests)
                step_fn = step[0] if step else None
            compile_s = time.perf_counter() - t0
            if profile and not dev.smoke:
                for name, fn in (("target forward", target_fn), ("first pass", first_fn), ("draft step", step_fn)):
                    if fn is not None:
                        log(f"kernels of the floor's {name}:\n" + kernel_list(fn))
            fns = {"iteration": (iteration_fn, False), "target": (target_fn, True), "first": (first_fn, True)}
            if step_fn is not None:
                fns["step"] = (step_fn, True)
            times = interleaved_us(dev, fns, rounds)
            times.setdefault("step", [0.0] * rounds)
            floors = [t + f + (depth - 1) * s for t, f, s in zip(times["target"], times["first"], times["step"],
                                                                  strict=True)]  # fmt: skip
            ratios = [i / f for i, f in zip(times["iteration"], floors, strict=True)]
            iteration_us, floor = median(times["iteration"]), median(floors)
            target_us, first_us, step_us = median(times["target"]), median(times["first"]), median(times["step"])
            length = acceptance.get((depth, topk, n))
            projected = length * plain_us / iteration_us if length is not None else None
            spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
            rows.append(label + [iteration_us, floor, median(ratios), spread, target_us, first_us, step_us,
                                 "n/a" if length is None else length, "n/a" if projected is None else projected])  # fmt: skip
            out["rows"].append(dict(zip(["drafts", "depth", "topk", "N", "iteration_us", "floor_us", "ratio",
                                         "ratio_range", "target_us", "first_pass_us", "step_us", "acceptance_length",
                                         "projected_speedup"], rows[-1], strict=True), compile_s=compile_s,
                                    rounds=times))  # fmt: skip
            log(f"{text}: iteration {iteration_us:.0f} µs, floor {floor:.0f} µs (ratio per round {spread}), "
                f"projected {projected if projected is None else round(projected, 2)} ({compile_s:.0f} s to build)")  # fmt: skip
            del decoder, state, requests
    out["plain_us"] = plain_us
    headers = ["drafts", "D", "topk", "N", "iteration µs", "floor µs", "iteration / floor", "per-round range",
               "target fwd µs", "draft first pass µs", "draft step µs", "acceptance length (demo pair)",
               "projected speedup"]  # fmt: skip
    print(f"Plain decoding: {plain_us:.1f} µs per token (its compiled iteration)\n")
    print(f"Medians of {rounds} rounds, each timing the iteration and its floor pieces one after another\n")
    print(table(headers, rows))
    return out


def record(out: dict, profile: bool) -> None:
    """Append the verify table to `tree_8b_verify`, the iterations to `tree_8b`."""
    plain = {"plain_iteration_us": out["plain_us"]} if "plain_us" in out else {}
    append_rows("tree_8b_verify", [({"N": int(n), "layers": out["layers"]}, {"target_fwd_us": us, **plain})
                                   for n, us in out["verify_us"].items()], device=out["device"])  # fmt: skip
    keys = ("drafts", "depth", "topk", "N")
    append_rows("tree_8b", [({**{k: r[k] for k in keys}, "layers": out["layers"], "profile": profile},
                             {**{k: v for k, v in r.items() if k not in keys and k != "rounds"}, **plain})
                            for r in out["rows"]], device=out["device"])  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, aot_eager: a check of the script")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument(
        "--configs",
        nargs="*",
        default=CONFIGS,
        metavar="D,K,N",
        help="K = 1, N = D + 1: a chain (none: skip the iteration table and plain decoding)",
    )
    parser.add_argument("--acceptance", nargs="+", default=DEFAULT_ACCEPTANCE, help="bench_tree.py JSON files")
    parser.add_argument(
        "--verify-sizes",
        type=int,
        nargs="*",
        default=[1, 4, 6, 8, 16, 32, 64],
        help="N of the verify table (none: skip it; each N compiles the 32-layer target)",
    )
    parser.add_argument("--json", help="write the tables' numbers as JSON")
    parser.add_argument("--profile", action="store_true", help="log each configuration's iteration kernels (stderr)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (medians reported)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    dev, budget = Device(args.smoke), Budget(args.budget_s)
    acceptance = load_acceptance(args.acceptance)
    layers = 2 if args.smoke else args.layers
    target, head = build_8b(dev, layers, 256 if args.smoke else 32000)
    name = "CPU" if args.smoke else torch.cuda.get_device_name()
    print(f"{name}, torch {torch.__version__}; {layers} target layers, B = 1\n")
    verify_us = {}
    if args.verify_sizes:
        verify_text, verify_us = verify_section(dev, target, args.verify_sizes)
        print(verify_text + "\n")
    out = {"device": name, "layers": layers, "verify_us": verify_us, "rows": []}
    if args.configs:
        out.update(iteration_section(dev, budget, target, head, args.configs, acceptance, args.profile, args.rounds))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    if not args.smoke:
        record(out, args.profile)
    print(f"\ntotal {budget.spent():.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
