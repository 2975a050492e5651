"""`specdraft demo` (python -m specdraft.demo): speculative decoding end to end, with
the byte-level Llama target (4 layers x 256) and a drafter that ship in the package
(specdraft.assets; trained on the Python standard library by
scripts/train_demo_pair.py and scripts/train_block_drafters.py, and run by `make
demo`, all in a clone of the project's source repository, not in the wheel): the
EAGLE-3 head (default), or with --drafter dflash / dspark a block drafter that
drafts its whole block (7 tokens) in one forward.

Plain and speculative greedy decoding of a few Python snippets, each iteration
compiled whole (torch.compile, fullgraph=True): the outputs must be identical, token
for token (exit status 1 otherwise). Then the statistics of the speculative run
(acceptance rate per draft position, mean acceptance length, tokens per verify
pass), tokens/s both ways, the texts, and a sampled run (temperature 0.7, seeded)
whose texts loop less than greedy ones.

    python -m specdraft.demo                      # CPU, compiled, K = 3
    python -m specdraft.demo --device cuda        # mode="reduce-overhead" there
    python -m specdraft.demo --k 5 --max-new-tokens 64 --no-compile
    python -m specdraft.demo --drafter dspark     # DSpark, K = its block size (7)
    specdraft demo --no-progress                  # the same, as the console script
    specdraft demo --json stats.json              # also write the printed statistics as JSON

Needs torch, safetensors and tqdm only (no test extras, no network).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from specdraft.__main__ import (
    check_device,
    check_writable,
    compile_message,
    run_reporting_errors,
    status,
    use_threads,
)
from specdraft.demo_args import (  # noqa: F401  (the demo's constants and parser, read from here too)
    BLOCK_DRAFTERS,
    BLOCK_SIZE,
    DEFAULT_K,
    DEFAULT_K_CUDA,
    DRAFTERS,
    MAX_MODEL_LEN,
    PROMPTS,
    SHOWN,
    TEMPERATURE,
    build_parser,
    parse_args,
)

# No models, training or generation code above: they load after the arguments are
# parsed (in main), so --help and argument errors answer without them.
if TYPE_CHECKING:
    import torch

    from specdraft.generation import GenerationResult


def compile_options(device: str, enabled: bool):
    """The iteration's torch.compile options (the decoder adds fullgraph=True,
    dynamic=False). CUDA: what mode="reduce-overhead" sets (triton.cudagraphs: each
    iteration one CUDA graph replay) and Inductor's loop reordering after fusion off
    (loop_ordering_after_fusion=False): on an H200 the 8B-shaped target's cold compile
    took 8-15% less, the 32-layer speculative iteration's Inductor part about a quarter
    less, and the target forward and draft step ran within 0.6% of their time with it
    on (benchmarks/README.md, "Compile time"). CPU: Inductor's C++ without SIMD code
    (cpp.simdlen=0): at these sizes the vectorised loops barely run faster, and
    generating and building them is about a quarter of the compile time.

    Not cpp.vec_isa_ok=False, which says the same for this compile but also for every
    later one in the process: Inductor probes the machine's vector ISAs once per
    process under whatever options the first compile had, so after it every compile
    of the process was scalar, and CPU flex_attention (the training evaluator's
    attention), which needs the vector ISA, failed to lower
    (tests/test_demo.py::test_demo_options_leave_later_compiles_vectorised)."""
    import torch

    if not enabled:
        return False
    if torch.device(device).type == "cuda":
        return {"options": {"triton.cudagraphs": True, "loop_ordering_after_fusion": False}}
    return {"options": {"cpp.simdlen": 0}}


def build_decoders(device, k: int, num_prompts: int, compile, max_model_len: int = MAX_MODEL_LEN, tree=None,
                   drafter: str = "eagle3", budget=None, calibration=None):  # fmt: skip
    """(plain, speculative) decoders over the shipped target and `drafter`, for
    batches of up to num_prompts prompts; with tree (a TreeShape; EAGLE-3 only), the
    speculative one drafts trees; with budget (an int, or for chains and blocks a
    StepCosts table), it verifies a budget of drafts (tree nodes) per iteration, its
    estimates calibrated with calibration (chains and blocks: the EMA's newest
    weight, or None)."""
    from specdraft.assets import load_demo_pair
    from specdraft.config import SpeculativeConfig
    from specdraft.generation import SpeculativeDecoder, TreeSpeculativeDecoder, num_kv_blocks
    from specdraft.proposers import BlockProposer, EagleProposer

    target, head = load_demo_pair(device=device, drafter=drafter)
    k = k if tree is None else tree.depth
    block = drafter in BLOCK_DRAFTERS
    config = SpeculativeConfig(
        method="block" if block else "eagle3", num_speculative_tokens=k, max_model_len=max_model_len,
        block_size=BLOCK_SIZE, return_draft_confidence=budget is not None,
    )  # fmt: skip
    reach = k if tree is None else tree.num_verify_tokens - 1  # KV positions a verify pass writes past a request
    caches = head.allocate_kv_caches(num_kv_blocks(num_prompts, max_model_len, reach, BLOCK_SIZE), BLOCK_SIZE)
    proposer = (BlockProposer if block else EagleProposer)(head, config, caches)
    plain = SpeculativeDecoder(target, None, max_model_len=max_model_len, block_size=BLOCK_SIZE, compile=compile)
    if tree is not None:
        return plain, TreeSpeculativeDecoder(target, proposer, tree, compile=compile, budget=budget)
    return plain, SpeculativeDecoder(target, proposer, compile=compile, budget=budget, calibration=calibration)


def encode(texts) -> list[list[int]]:
    return [list(t.encode()) for t in texts]


def decode(tokens: torch.Tensor) -> str:
    return bytes(tokens.tolist()).decode("utf-8", errors="replace")


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def first_difference(a: GenerationResult, b: GenerationResult):
    """(request, token index) of the first token that differs, or None. Host-side,
    after both runs: the tokens are CPU tensors."""
    import torch

    for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=True)):
        if not torch.equal(x, y):
            n = min(len(x), len(y))
            mismatch = (x[:n] != y[:n]).nonzero()
            return i, int(mismatch[0]) if len(mismatch) else n
    return None


def statistics(plain: GenerationResult, spec: GenerationResult) -> dict:
    """The speculative run's statistics against the plain run's: what report prints
    and --json writes (unrounded)."""
    s, p = spec.stats, plain.stats
    emitted = (s.num_generated - 1).clamp(min=0).sum().item()  # the prefill samples each request's first token
    passes = int(s.num_verify_passes)
    sp, pp = s.decode_tokens_per_s.item(), p.decode_tokens_per_s.item()
    se, pe = s.tokens_per_s.item(), p.tokens_per_s.item()
    ranks = s.accepted_sibling_rank
    return {
        "acceptance_rate_per_position": s.acceptance_rate_per_position.tolist(),
        "accepted_sibling_rank": None if ranks is None else [int(n) for n in ranks.tolist()],
        "mean_acceptance_length": s.mean_acceptance_length.item(),
        "tokens_per_verify_pass_per_request": emitted / s.request_passes.sum().item(),
        "tokens_per_batched_verify_pass": emitted / passes,
        "verify_passes": {"speculative": passes, "plain": int(p.num_verify_passes)},
        "decode_tokens_per_s": {"plain": pp, "speculative": sp, "speedup": sp / pp},
        "tokens_per_s": {"plain": pe, "speculative": se, "speedup": se / pe},
    }


def report(stats: dict, k: int, num_requests: int) -> None:
    """statistics(...) as printed."""
    tree = stats["accepted_sibling_rank"] is not None
    label = "d" if tree else "k"
    rates = "  ".join(f"{label}={i + 1}: {r:.3f}" for i, r in enumerate(stats["acceptance_rate_per_position"]))
    print(f"acceptance rate per {'tree depth    ' if tree else 'draft position'}   {rates}")
    if tree:
        ranks = "  ".join(f"{i + 1}: {n}" for i, n in enumerate(stats["accepted_sibling_rank"]))
        print(f"accepted nodes by sibling rank       {ranks}  (1: the draft's likeliest child)")
    print(f"mean acceptance length               {stats['mean_acceptance_length']:.3f} tokens per request per "
          f"verify pass (accepted drafts + the bonus / recovered token; at most {k + 1})")  # fmt: skip
    print(f"mean tokens per verify pass          {stats['tokens_per_verify_pass_per_request']:.3f} per request (what "
          f"was kept after the cut at max_new_tokens); {stats['tokens_per_batched_verify_pass']:.2f} per batched "
          f"target pass over {num_requests} requests")  # fmt: skip
    passes = stats["verify_passes"]
    print(f"target verify passes                 speculative {passes['speculative']}, plain {passes['plain']}")
    for key, what in (("decode_tokens_per_s", "decode"), ("tokens_per_s", "prefill included")):
        rate = stats[key]
        print(f"{f'tokens/s ({what})':<37}plain {rate['plain']:,.0f}   speculative {rate['speculative']:,.0f}   "
              f"speedup {rate['speedup']:.2f}x")  # fmt: skip


def write_json(path: Path, record: dict) -> None:
    path.write_text(json.dumps(record, indent=1))
    print(f"\nwrote {path}")


def show_texts(title: str, prompts, result: GenerationResult) -> None:
    for i in [i for i in SHOWN if i < len(prompts)] or [0]:
        print(f"\n--- {title}, prompt {i + 1} (prompt, then >>> the {len(result.tokens[i])} generated bytes) ---")
        print(prompts[i] + ">>>" + decode(result.tokens[i]))


def main(argv=None, prog: str = "python -m specdraft.demo") -> int:
    args = parse_args(argv, prog, description=__doc__.split("\n\n")[0])
    return run_reporting_errors(run_demo, args)


def choose_drafts(args: argparse.Namespace, num_requests: int) -> None:
    """--tree auto: the measured table's drafts at this batch size (a chain sets --k;
    where the table picks plain decoding, the demo keeps its chain to compare)."""
    from specdraft.generation.draft_choice import DEMO_PAIR_DRAFTS, default_drafts

    choice = default_drafts(num_requests, DEMO_PAIR_DRAFTS)
    if choice is None:
        print(f"--tree auto: at B = {num_requests} the measured table picks plain decoding; showing K = {args.k}")
        args.tree = None
    elif choice.topk == 1:
        print(f"--tree auto: at B = {num_requests} the measured table picks a chain of K = {choice.depth}")
        args.tree, args.k = None, choice.depth
    else:
        print(f"--tree auto: at B = {num_requests} the measured table picks the tree {choice.depth},"
              f"{choice.topk},{choice.num_verify_tokens}")  # fmt: skip
        args.tree = choice


def choose_chain_or_tree(args: argparse.Namespace, num_requests: int) -> None:
    """--tree auto --budget auto: the chain under the demo pair's step costs or the
    tree of its tree costs, whichever of the two tables predicts more tokens per
    second at this batch size (generation/chain_or_tree.py); --budget auto then
    takes that table's choice."""
    from specdraft.generation.chain_or_tree import TREE, predicted_speeds
    from specdraft.generation.step_costs import demo_pair_costs
    from specdraft.generation.tree_costs import demo_pair_tree_costs
    from specdraft.tree_shape import TreeShape

    tree_costs = demo_pair_tree_costs()
    tree = TreeShape(*tree_costs.shape)
    speeds = predicted_speeds(num_requests, demo_pair_costs(), tree_costs)
    faster = max(speeds, key=speeds.__getitem__)  # the chain (the first key) on a tie, as ChainOrTree
    shape = f"{tree.depth},{tree.topk},{tree.num_verify_tokens}"
    print(f"--tree auto --budget auto: at B = {num_requests} the step costs predict {speeds['chain']:,.0f} tokens/s "
          f"for the chain, the tree costs {speeds['tree']:,.0f} for the tree {shape}: the {faster}")  # fmt: skip
    args.tree = tree if faster == TREE else None


def describe_drafter(head, name: str) -> str:
    """The drafter as the header line names it."""
    block = getattr(head, "block", None)
    if block is None:
        return f"{name} head"
    layers = head.config.num_layers
    markov = f", Markov rank {block.markov_rank}" if block.markov_rank else ""
    return f"{name} head ({layers} layer{'s' if layers > 1 else ''}, block {block.block_size}{markov})"


def run_as(decoder) -> str:
    """What the speculative decoder's last run did: a budget table's choice runs as
    plain decoding or the fixed-K iteration where it is one of those; a tree table's,
    as the whole tree, plain decoding or a node budget."""
    if decoder.proposer is None:
        return "plain decoding"
    tree = getattr(decoder, "tree", None)
    if tree is not None:
        shape = f"{tree.depth},{tree.topk},{tree.num_verify_tokens}"
        if decoder.budget is None:
            return f"the whole tree {shape}"
        return "plain decoding" if decoder.budget == 0 else f"tree {shape}, budget {decoder.budget} nodes"
    if decoder.budget is None:
        return f"fixed K = {decoder.k}"
    return f"K = {decoder.k}, budget {decoder.budget}"


def run_demo(args: argparse.Namespace) -> int:
    if args.json is not None:
        check_writable("--json", args.json)
    device = check_device(args.device)
    import torch

    from specdraft.config import SamplingParams
    from specdraft.generation import SpeculativeDecoder, TreeSpeculativeDecoder

    use_threads(args.threads, device)
    compile = compile_options(args.device, not args.no_compile)
    texts = PROMPTS[: args.prompts]
    prompts = encode(texts)
    if args.tree == "auto" and args.budget == "auto":
        choose_chain_or_tree(args, len(prompts))
    elif args.tree == "auto":
        choose_drafts(args, len(prompts))
    budget = args.budget
    if budget == "auto" and args.tree is not None:
        from specdraft.generation.tree_costs import demo_pair_tree_costs

        budget = demo_pair_tree_costs()
        nodes = budget.choose(len(prompts))
        what = "the whole tree" if nodes is None else "plain decoding" if nodes == 0 else f"at most {nodes} nodes"
        print(f"--budget auto: at B = {len(prompts)} the tree costs measured on the {budget.device} pick {what} "
              "per iteration")  # fmt: skip
    elif budget == "auto":
        from specdraft.generation.step_costs import choose_budget, demo_pair_costs

        budget = demo_pair_costs()
        if budget.max_k > args.k:
            raise ValueError(f"--budget auto: the demo pair's step costs draft up to K = {budget.max_k} (pass --k "
                             f"{budget.max_k} or more)")  # fmt: skip
        k, drafts = choose_budget(len(prompts), budget)
        what = (
            "plain decoding" if k == 0
            else f"{k} drafts per request, all verified (the fixed-K iteration)" if drafts >= k * len(prompts)
            else f"{k} drafts per request, at most {drafts} verified per iteration"
        )  # fmt: skip
        print(f"--budget auto: at B = {len(prompts)} the step costs measured on the {budget.device} pick {what}")
    plain, spec = build_decoders(device, args.k, len(prompts), compile, tree=args.tree, drafter=args.drafter,
                                 budget=budget, calibration=args.calibration)  # fmt: skip
    k = args.k if args.tree is None else args.tree.depth
    how = "eager"
    if compile is not False:
        how = "torch.compile(fullgraph=True, " + ("CUDA graphs)" if device.type == "cuda" else "no SIMD)")
    where = f"{device.type}" + (f", {torch.get_num_threads()} thread(s)" if device.type == "cpu" else "")
    name = DRAFTERS[args.drafter]
    print(f"specdraft demo: {name} speculative decoding with the shipped byte-level pair")
    drafts = (
        f"K = {args.k}"
        + ("" if args.budget is None else f", budget {args.budget}")
        + ("" if args.calibration is None else f", calibration {args.calibration}")
        if args.tree is None
        else (
            f"tree depth {args.tree.depth}, topk {args.tree.topk}, {args.tree.num_verify_tokens} verified tokens"
            + (
                ""
                if args.budget is None
                else ", budget auto"
                if args.budget == "auto"
                else f", budget {args.budget} nodes"
            )
        )
    )
    print(f"target 4 x 256 Llama (vocab 256 bytes), {describe_drafter(spec.proposer.model, name)}, {drafts}; "
          f"{where}; torch {torch.__version__}")  # fmt: skip
    print(f"{len(prompts)} Python snippets, {args.max_new_tokens} new tokens each, greedy; iterations {how}\n")

    progress = not args.no_progress
    run = {"max_new_tokens": args.max_new_tokens}
    # A first run of one iteration compiles it (max_new_tokens changes no shape, so the
    # timed runs below reuse the graph) and warms up eager mode alike.
    for name, decoder in (("plain", plain), ("speculative", spec)):
        if compile and progress:
            status(compile_message(f"the {name} iteration", device))
        _, seconds = timed(lambda d=decoder: d.generate(prompts, max_new_tokens=2))
        if compile and progress:
            status(f"compiled in {seconds:.1f} s")
        print(f"{'compile' if compile else 'warm-up'} + first iteration, {name}: {seconds:.1f} s", flush=True)
    plain_out = plain.generate(prompts, progress=progress and "plain", **run)
    spec_out = spec.generate(prompts, progress=progress and "speculative", **run)

    diff = first_difference(plain_out, spec_out)
    total = sum(len(t) for t in plain_out.tokens)
    record = {
        "drafter": args.drafter, "device": str(device), "compiled": compile is not False, "k": k,
        "budget": None if budget is None else spec.budget, "run_as": run_as(spec), "calibration": args.calibration,
        "tree": None if args.tree is None else [args.tree.depth, args.tree.topk, args.tree.num_verify_tokens],
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "tokens": total,
        "greedy_identical": diff is None,
        "first_difference": None if diff is None else {"prompt": diff[0] + 1, "token": diff[1]},
    }  # fmt: skip
    print()
    if diff is not None:
        print(
            f"FAIL: greedy outputs differ (prompt {diff[0] + 1}, token {diff[1]}): speculative decoding is not lossless"
        )
        if args.json is not None:
            write_json(args.json, record)
        return 1
    print(f"greedy outputs identical: yes ({len(prompts)} prompts, {total} tokens, plain vs speculative)")
    record |= statistics(plain_out, spec_out)
    report(record, k, len(prompts))
    show_texts("greedy", texts, spec_out)
    record["sampled"] = None

    if not args.no_sampled:
        # Eager: the sampled iteration (the full rejection sampler) would be a third compile.
        if args.tree is None:
            eager = SpeculativeDecoder(spec.target, spec.full_proposer, budget=budget, calibration=args.calibration)
        else:
            eager = TreeSpeculativeDecoder(spec.target, spec.full_proposer, args.tree, budget=budget)
        seeds = torch.arange(args.seed, args.seed + len(prompts))
        num = len(prompts)
        truncation = {}
        if args.top_k > 0 or args.top_p < 1.0 or args.min_p > 0.0:
            truncation = {"top_k": torch.full((num,), args.top_k, dtype=torch.int32),
                          "top_p": torch.full((num,), args.top_p), "min_p": torch.full((num,), args.min_p)}  # fmt: skip
        sampling = SamplingParams(torch.full((num,), TEMPERATURE), seeds, **truncation)
        sampled = eager.generate(prompts, sampling=sampling, progress=progress and "sampled", **run)
        kept = f", top-k {args.top_k}, top-p {args.top_p}, min-p {args.min_p}" if truncation else ""
        print(f"\nsampled run (temperature {TEMPERATURE}{kept}, seeds {args.seed}..{args.seed + num - 1}, eager): "
              f"mean acceptance length {sampled.stats.mean_acceptance_length.item():.3f}")  # fmt: skip
        show_texts(f"sampled, T = {TEMPERATURE}", texts, sampled)
        record["sampled"] = {"temperature": TEMPERATURE, "seeds": [args.seed, args.seed + len(prompts) - 1],
                             "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
                             "mean_acceptance_length": sampled.stats.mean_acceptance_length.item()}  # fmt: skip
    if args.json is not None:
        write_json(args.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
