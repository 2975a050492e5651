"""`make demo` (python -m specdraft.demo): speculative decoding end to end, with the
byte-level Llama target (4 layers x 256) and the EAGLE-3 head that ship in the
package (specdraft.assets, trained on the Python standard library by
scripts/train_demo_pair.py).

Plain and speculative greedy decoding of a few Python snippets, each iteration
compiled whole (torch.compile, fullgraph=True): the outputs must be identical, token
for token (exit status 1 otherwise). Then the statistics of the speculative run
(acceptance rate per draft position, mean acceptance length, tokens per verify
pass), tokens/s both ways, the texts, and a sampled run (temperature 0.7, seeded)
whose texts loop less than greedy ones.

    python -m specdraft.demo                      # CPU, compiled, K = 3
    python -m specdraft.demo --device cuda        # mode="reduce-overhead" there
    python -m specdraft.demo --k 5 --max-new-tokens 64 --no-compile
    specdraft demo --no-progress                  # the same, as the console script

Needs torch, safetensors and tqdm only (no test extras, no network).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from specdraft.__main__ import (
    DEVICE_HELP,
    NO_PROGRESS_HELP,
    ArgumentParser,
    check_device,
    compile_message,
    run_reporting_errors,
    status,
)

# No models, training or generation code above: they load after the arguments are
# parsed (in main), so --help and argument errors answer without them.
if TYPE_CHECKING:
    import torch

    from specdraft.generation import GenerationResult

PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n',
    "import os\nimport sys\n\n\ndef main(argv=None):\n    if argv is None:\n        argv = sys.argv[1:]\n",
    'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n        self._items = []\n\n'
    "    def push(self, item):\n",
    'def read_config(path):\n    with open(path, encoding="utf-8") as f:\n',
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__,",
    "try:\n    import _thread\nexcept ImportError:\n",
)
MAX_MODEL_LEN = 384  # the longest prompt (~130 bytes) + max_new_tokens fits
BLOCK_SIZE = 16
TEMPERATURE = 0.7
SHOWN = (0, 2)  # the prompts whose texts are printed (the greedy text of prompt 1 only loops)


def build_parser(prog: str = "python -m specdraft.demo") -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help=DEVICE_HELP + "; cuda compiles with mode=reduce-overhead")
    parser.add_argument("--k", type=int, default=3, help="draft tokens per verify pass (default 3)")
    parser.add_argument(
        "--tree", metavar="D,K,N", help="draft an EAGLE-2 tree instead of a chain: depth D, topk K, N verified "
        "tokens (root included), e.g. 4,4,16; or auto: tree, chain or none by batch size, from the measured "
        "table (specdraft.generation.draft_choice)",
    )  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=160, help="per prompt (default 160)")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many of the {len(PROMPTS)} snippets")
    parser.add_argument("--no-compile", action="store_true", help="run the iterations eagerly")
    parser.add_argument("--no-sampled", action="store_true", help="skip the sampled run")
    parser.add_argument("--seed", type=int, default=0, help="first request seed of the sampled run")
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads (default 1: the matmuls are tiny, and more threads "
        "only contend on a shared machine)",
    )  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    return parser


def parse_args(argv=None, prog: str = "python -m specdraft.demo") -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts must be in [1, {len(PROMPTS)}]")
    if args.k < 1 or args.max_new_tokens < 2:
        parser.error("--k must be >= 1 and --max-new-tokens >= 2")
    if args.tree is not None:
        args.tree = parse_tree(parser, args.tree)
    longest = max(len(p.encode()) for p in PROMPTS)
    if longest + args.max_new_tokens > MAX_MODEL_LEN:
        parser.error(f"--max-new-tokens must be <= {MAX_MODEL_LEN - longest} (max_model_len {MAX_MODEL_LEN})")
    return args


def parse_tree(parser: argparse.ArgumentParser, text: str):
    """--tree D,K,N as a TreeShape (its own checks name what is wrong), or "auto"."""
    from specdraft.proposers.tree_build import TreeShape

    if text == "auto":
        return text
    try:
        depth, topk, num_verify_tokens = (int(x) for x in text.split(","))
    except ValueError:
        parser.error(f"--tree must be three integers D,K,N (e.g. 4,4,16), got {text!r}")
    try:
        return TreeShape(depth, topk, num_verify_tokens)
    except ValueError as error:
        parser.error(f"--tree {text}: {error}")


def compile_options(device: str, enabled: bool):
    """The iteration's torch.compile options (the decoder adds fullgraph=True,
    dynamic=False). CUDA: mode="reduce-overhead", each iteration one CUDA graph
    replay. CPU: Inductor's C++ without SIMD code (cpp.vec_isa_ok=False): at these
    sizes the vectorised loops barely run faster, generating and building them is
    about a quarter of the compile time, and without them Inductor skips its
    vector-ISA probe (test builds of a few seconds, once per process)."""
    import torch

    if not enabled:
        return False
    if torch.device(device).type == "cuda":
        return {"mode": "reduce-overhead"}
    return {"options": {"cpp.vec_isa_ok": False}}


def build_decoders(device, k: int, num_prompts: int, compile, max_model_len: int = MAX_MODEL_LEN, tree=None):
    """(plain, speculative) decoders over the shipped pair, for batches of up to
    num_prompts prompts; with tree (a TreeShape), the speculative one drafts trees."""
    from specdraft.assets import load_demo_pair
    from specdraft.config import SpeculativeConfig
    from specdraft.generation import SpeculativeDecoder, TreeSpeculativeDecoder, num_kv_blocks
    from specdraft.proposers import EagleProposer

    target, head = load_demo_pair(device=device)
    k = k if tree is None else tree.depth
    config = SpeculativeConfig(
        method="eagle3", num_speculative_tokens=k, max_model_len=max_model_len, block_size=BLOCK_SIZE
    )
    reach = k if tree is None else tree.num_verify_tokens - 1  # KV positions a verify pass writes past a request
    caches = head.allocate_kv_caches(num_kv_blocks(num_prompts, max_model_len, reach, BLOCK_SIZE), BLOCK_SIZE)
    proposer = EagleProposer(head, config, caches)
    plain = SpeculativeDecoder(target, None, max_model_len=max_model_len, block_size=BLOCK_SIZE, compile=compile)
    if tree is not None:
        return plain, TreeSpeculativeDecoder(target, proposer, tree, compile=compile)
    return plain, SpeculativeDecoder(target, proposer, compile=compile)


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


def report(plain: GenerationResult, spec: GenerationResult, k: int) -> None:
    s, p = spec.stats, plain.stats
    tree = s.accepted_sibling_rank is not None
    label = "d" if tree else "k"
    rates = "  ".join(f"{label}={i + 1}: {r:.3f}" for i, r in enumerate(s.acceptance_rate_per_position.tolist()))
    print(f"acceptance rate per {'tree depth    ' if tree else 'draft position'}   {rates}")
    if tree:
        ranks = "  ".join(f"{i + 1}: {int(n)}" for i, n in enumerate(s.accepted_sibling_rank.tolist()))
        print(f"accepted nodes by sibling rank       {ranks}  (1: the draft's likeliest child)")
    print(f"mean acceptance length               {s.mean_acceptance_length.item():.3f} tokens per request per "
          f"verify pass (accepted drafts + the bonus / recovered token; at most {k + 1})")  # fmt: skip
    emitted = (s.num_generated - 1).clamp(min=0).sum().item()  # the prefill samples each request's first token
    request_passes = s.request_passes.sum().item()
    num_reqs, passes = len(spec.tokens), int(s.num_verify_passes)
    print(f"mean tokens per verify pass          {emitted / request_passes:.3f} per request (what was kept after "
          f"the cut at max_new_tokens); {emitted / passes:.2f} per batched target pass over {num_reqs} requests")  # fmt: skip
    print(f"target verify passes                 speculative {passes}, plain {int(p.num_verify_passes)}")
    sp, pp = s.decode_tokens_per_s.item(), p.decode_tokens_per_s.item()
    print(f"tokens/s (decode)                    plain {pp:,.0f}   speculative {sp:,.0f}   speedup {sp / pp:.2f}x")
    se, pe = s.tokens_per_s.item(), p.tokens_per_s.item()
    print(f"tokens/s (prefill included)          plain {pe:,.0f}   speculative {se:,.0f}   speedup {se / pe:.2f}x")


def show_texts(title: str, prompts, result: GenerationResult) -> None:
    for i in [i for i in SHOWN if i < len(prompts)] or [0]:
        print(f"\n--- {title}, prompt {i + 1} (prompt, then >>> the {len(result.tokens[i])} generated bytes) ---")
        print(prompts[i] + ">>>" + decode(result.tokens[i]))


def main(argv=None, prog: str = "python -m specdraft.demo") -> int:
    args = parse_args(argv, prog)
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


def run_demo(args: argparse.Namespace) -> int:
    device = check_device(args.device)
    import torch

    from specdraft.config import SamplingParams
    from specdraft.generation import SpeculativeDecoder, TreeSpeculativeDecoder

    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    compile = compile_options(args.device, not args.no_compile)
    texts = PROMPTS[: args.prompts]
    prompts = encode(texts)
    if args.tree == "auto":
        choose_drafts(args, len(prompts))
    plain, spec = build_decoders(device, args.k, len(prompts), compile, tree=args.tree)
    k = args.k if args.tree is None else args.tree.depth
    how = "eager"
    if compile is not False:
        how = "torch.compile(fullgraph=True, " + ("mode=reduce-overhead)" if device.type == "cuda" else "no SIMD)")
    where = f"{device.type}" + (f", {torch.get_num_threads()} thread(s)" if device.type == "cpu" else "")
    print("specdraft demo: EAGLE-3 speculative decoding with the shipped byte-level pair")
    drafts = (
        f"K = {args.k}"
        if args.tree is None
        else (f"tree depth {args.tree.depth}, topk {args.tree.topk}, {args.tree.num_verify_tokens} verified tokens")
    )
    print(f"target 4 x 256 Llama (vocab 256 bytes), EAGLE-3 head, {drafts}; {where}; torch {torch.__version__}")
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
    print()
    if diff is not None:
        print(
            f"FAIL: greedy outputs differ (prompt {diff[0] + 1}, token {diff[1]}): speculative decoding is not lossless"
        )
        return 1
    print(f"greedy outputs identical: yes ({len(prompts)} prompts, {total} tokens, plain vs speculative)")
    report(plain_out, spec_out, k)
    show_texts("greedy", texts, spec_out)

    if not args.no_sampled:
        # Eager: the sampled iteration (the full rejection sampler) would be a third compile.
        if args.tree is None:
            eager = SpeculativeDecoder(spec.target, spec.proposer)
        else:
            eager = TreeSpeculativeDecoder(spec.target, spec.proposer, args.tree)
        seeds = torch.arange(args.seed, args.seed + len(prompts))
        sampling = SamplingParams(torch.full((len(prompts),), TEMPERATURE), seeds)
        sampled = eager.generate(prompts, sampling=sampling, progress=progress and "sampled", **run)
        print(f"\nsampled run (temperature {TEMPERATURE}, seeds {args.seed}..{args.seed + len(prompts) - 1}, eager): "
              f"mean acceptance length {sampled.stats.mean_acceptance_length.item():.3f}")  # fmt: skip
        show_texts(f"sampled, T = {TEMPERATURE}", texts, sampled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
