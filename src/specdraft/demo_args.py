"""The command line of `specdraft demo` (specdraft.demo): its flags, their checks
(each bad value is argparse's error, naming the flag, before torch loads), and the
demo's fixed sizes and prompts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdraft.__main__ import (
    DEMO_PAIR,
    DEVICE_HELP,
    NO_PROGRESS_HELP,
    ArgumentParser,
    add_threads_option,
    check_threads,
)

PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n',
    "import os\nimport sys\n\n\ndef main(argv=None):\n    if argv is None:\n        argv = sys.argv[1:]\n",
    'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n        self._items = []\n\n'
    "    def push(self, item):\n",
    'def read_config(path):\n    with open(path, encoding="utf-8") as f:\n',
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__,",
    "try:\n    import _thread\nexcept ImportError:\n",
)
DEFAULT_K = 3
# On CUDA, with neither --tree nor --budget: the fastest chain on the demo pair at B =
# 1 in every H200 run of benchmarks/bench_tree.py (speed-up over plain decoding 1.99x
# and 3.79x against K = 3's 1.72x and 2.74x; benchmarks/README.md). On the CPU the
# deeper chain's extra draft steps cost more than they save, so K = 3 stays.
DEFAULT_K_CUDA = 5
DRAFTERS = {"eagle3": "EAGLE-3", "dflash": "DFlash", "dspark": "DSpark"}
BLOCK_DRAFTERS = ("dflash", "dspark")
MAX_MODEL_LEN = 384  # the longest prompt (~130 bytes) + max_new_tokens fits
BLOCK_SIZE = 16
TEMPERATURE = 0.7
SHOWN = (0, 2)  # the prompts whose texts are printed (the greedy text of prompt 1 only loops)


def build_parser(prog: str = "python -m specdraft.demo", description: str | None = None) -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--device", default="cpu", help=DEVICE_HELP + "; cuda compiles with CUDA graphs (as mode=reduce-overhead)"
    )
    parser.add_argument(
        "--drafter", choices=tuple(DRAFTERS), default="eagle3", help="the shipped drafter: eagle3 (default; an "
        "EAGLE-3 head, one draft step per token), dflash or dspark (block drafters: the whole block in one forward; "
        "DSpark adds a Markov head over the block and a confidence head)",
    )  # fmt: skip
    parser.add_argument(
        "--k", type=int, help=f"draft tokens per verify pass (default {DEFAULT_K}; on cuda without --tree or --budget "
        f"{DEFAULT_K_CUDA}; a block drafter: its block size, "
        "at most that; at most --max-new-tokens - 1, the drafts a run can keep). Not with --tree D,K,N (the tree's "
        "depth D is its K); with --tree auto, the chain shown where the table picks plain decoding",
    )  # fmt: skip
    parser.add_argument(
        "--tree", metavar="D,K,N", help="draft an EAGLE-2 tree instead of a chain: depth D, topk K, N verified "
        "tokens (root included), e.g. 4,4,16; or auto: tree, chain or none by batch size, from the measured "
        "table (specdraft.generation.draft_choice)",
    )  # fmt: skip
    parser.add_argument(
        "--budget", metavar="N|auto", help="verify at most N drafts per iteration over the batch, those of best "
        "expected gain (budgeted verification; chains, blocks and trees: tree nodes); auto: the budget with the most expected tokens "
        "per second at this batch size, from the demo pair's measured step costs (0 there: plain decoding; with "
        "--tree 4,4,16, from its measured tree costs: the whole tree, none or a node budget; with --tree auto, "
        "the chain or that tree, whichever of the two tables predicts faster)",
    )  # fmt: skip
    parser.add_argument(
        "--calibration", type=float, metavar="W", help="with --budget: scale each position's survival estimates "
        "by a running ratio of the drafts accepted there to their estimates (an EMA, the newest pass weighing W "
        "in (0, 1])",
    )  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=160, help="per prompt (default 160)")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many of the {len(PROMPTS)} snippets")
    parser.add_argument("--no-compile", action="store_true", help="run the iterations eagerly")
    parser.add_argument("--no-sampled", action="store_true", help="skip the sampled run")
    parser.add_argument("--seed", type=int, default=0, help="first request seed of the sampled run")
    parser.add_argument("--top-k", type=int, default=0, help="the sampled run's top-k (default 0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="the sampled run's top-p, in (0, 1] (default 1: off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="the sampled run's min-p, in [0, 1] (default 0: off)")
    add_threads_option(parser)
    parser.add_argument(
        "--json", type=Path, help="also write the statistics printed (acceptance per position, acceptance length, "
        "tokens/s, speedups, the identity check) to this file as JSON; its folder is created if missing",
    )  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    return parser


def parse_args(argv=None, prog: str = "python -m specdraft.demo", description: str | None = None) -> argparse.Namespace:
    """The demo's arguments, checked: argparse's error (exit status 2) names a bad one."""
    parser = build_parser(prog, description)
    args = parser.parse_args(argv)
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts must be in [1, {len(PROMPTS)}]")
    check_threads(parser, args)
    if args.max_new_tokens < 2:
        parser.error("--max-new-tokens must be >= 2")
    longest = max(len(p.encode()) for p in PROMPTS)
    if longest + args.max_new_tokens > MAX_MODEL_LEN:
        parser.error(f"--max-new-tokens must be <= {MAX_MODEL_LEN - longest} (max_model_len {MAX_MODEL_LEN})")
    if args.k is not None and not 1 <= args.k <= args.max_new_tokens - 1:
        parser.error(f"--k must be in [1, {args.max_new_tokens - 1}] (--max-new-tokens - 1: a run keeps at most "
                     f"that many drafts), got {args.k}")  # fmt: skip
    check_budget_flag(parser, args)
    if not 0.0 < args.top_p <= 1.0:
        parser.error(f"--top-p must be in (0, 1] (1: off), got {args.top_p}")
    if not 0.0 <= args.min_p <= 1.0:
        parser.error(f"--min-p must be in [0, 1] (0: off), got {args.min_p}")
    if args.drafter in BLOCK_DRAFTERS:
        check_block_drafter(parser, args)
        return args
    # The tree last: only a well-formed D,K,N loads TreeShape's checks (and torch).
    tree = None if args.tree is None else tree_numbers(parser, args.tree)
    if tree is not None and args.k is not None:
        parser.error(f"--k and --tree {args.tree}: the tree's depth is its K (pass one of them)")
    if args.k is None:
        chain_on_cuda = args.device.startswith("cuda") and args.tree is None and args.budget is None
        args.k = DEFAULT_K_CUDA if chain_on_cuda else DEFAULT_K
    if tree is not None:
        args.tree = tree_shape(parser, args.tree, tree)
    return args


def check_budget_flag(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--budget: an int >= 0 or auto (with a tree, only the shipped tree costs' shape;
    --calibration: chains and blocks); --calibration: in (0, 1], only with --budget."""
    if args.calibration is not None:
        if args.budget is None:
            parser.error("--calibration calibrates a budget's survival estimates: pass --budget as well")
        if not 0.0 < args.calibration <= 1.0:
            parser.error(f"--calibration must be in (0, 1] (the newest pass's weight), got {args.calibration}")
    if args.budget is None:
        return
    if args.tree == "auto":
        if args.budget != "auto":
            parser.error(f"--budget {args.budget} with --tree auto: an int budget counts drafts or tree nodes, so "
                         "pass a tree shape (D,K,N), leave --tree out, or pass --budget auto (the chain or the "
                         "tree, whichever the demo pair's measured costs predict faster)")  # fmt: skip
        if args.calibration is not None:
            parser.error("--calibration with --tree auto --budget auto: the tree may be chosen, and a tree ranks "
                         "its nodes by their path probabilities as they are")  # fmt: skip
        return
    if args.tree is not None:
        shipped = shipped_tree_costs_shape() if args.budget == "auto" else None
        if shipped is not None and tree_text_numbers(args.tree) not in (None, shipped):
            parser.error(f"--budget auto with --tree {args.tree}: the demo pair's tree costs were measured with "
                         f"--tree {','.join(map(str, shipped))}; pass that tree or an int budget of tree nodes")  # fmt: skip
        if args.calibration is not None:
            parser.error(f"--calibration with --tree {args.tree}: a tree ranks its nodes by their path "
                         "probabilities as they are")  # fmt: skip
    if args.budget != "auto":
        try:
            args.budget = int(args.budget)
        except ValueError:
            parser.error(f"--budget must be auto or an int >= 0, got {args.budget!r}")
        if args.budget < 0:
            parser.error(f"--budget must be auto or an int >= 0, got {args.budget}")


def shipped_tree_costs_shape() -> tuple[int, ...]:
    """The tree the shipped demo pair tree costs were measured with (plain JSON: no
    torch before the argument checks)."""
    path = Path(__file__).parent / "generation" / "demo_pair_tree_costs.json"
    return tuple(json.loads(path.read_text())["shape"])


def tree_text_numbers(text: str) -> tuple[int, ...] | None:
    """D,K,N as three ints, or None where it is not (tree_numbers reports that)."""
    try:
        numbers = tuple(int(part) for part in text.split(","))
    except ValueError:
        return None
    return numbers if len(numbers) == 3 else None


def shipped_block_size(parser: argparse.ArgumentParser, drafter: str) -> int:
    """The shipped block drafter's block_size, from its config.json (plain JSON: no
    torch before the argument checks)."""
    path = DEMO_PAIR / drafter / "config.json"
    try:
        return int(json.loads(path.read_text())["block_size"])
    except (OSError, ValueError, KeyError) as error:
        parser.error(f"--drafter {drafter}: cannot read the shipped drafter's {path}: {error}")


def check_block_drafter(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--drafter dflash / dspark: no tree (a block is a chain), --k at most the block
    size (default: all of it)."""
    if args.tree is not None:
        parser.error(f"--tree {args.tree} with --drafter {args.drafter}: a block drafter drafts one chain, its block "
                     "(use --k)")  # fmt: skip
    size = shipped_block_size(parser, args.drafter)
    if args.k is not None and args.k > size:
        parser.error(f"--k {args.k} with --drafter {args.drafter}: a block drafts at most its block size, {size}")
    args.k = min(size, args.max_new_tokens - 1) if args.k is None else args.k


def tree_numbers(parser: argparse.ArgumentParser, text: str) -> tuple[int, int, int] | None:
    """--tree's D,K,N as three ints, or None for "auto" (argparse's error otherwise)."""
    if text == "auto":
        return None
    try:
        depth, topk, num_verify_tokens = (int(x) for x in text.split(","))
    except ValueError:
        parser.error(f"--tree must be auto or three integers D,K,N (e.g. 4,4,16), got {text!r}")
    return depth, topk, num_verify_tokens


def tree_shape(parser: argparse.ArgumentParser, text: str, numbers: tuple[int, int, int]):
    """--tree D,K,N as a TreeShape (its own checks name what is wrong)."""
    from specdraft.tree_shape import TreeShape  # plain Python: no torch before the error

    depth, topk, num_verify_tokens = numbers
    try:
        return TreeShape(depth, topk, num_verify_tokens)
    except ValueError as error:
        parser.error(f"--tree {text}: {error}")
