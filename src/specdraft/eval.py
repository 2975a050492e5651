"""`python -m specdraft.eval HEAD DATA` (or `specdraft eval`): evaluate a draft head on
saved target outputs (shards from `python -m specdraft.capture` or
`specdraft.training.save_batch`) and print its per-step table; --plot writes a PNG of
acceptance per step. --temperature (default 0: greedy) with a request's --top-k,
--top-p and --min-p: the expected acceptance Σ min(p, q) of the target's and the
draft's distributions, both truncated (the draft sampling inside the truncation).

    python -m specdraft.capture demo data/                     # the shipped target's outputs
    python -m specdraft.eval demo data/ --steps 3 --plot acceptance.png

HEAD is a draft-head folder (load_draft_model: EAGLE-1, EAGLE-3, MTP, multi-layer
MTP; or a block drafter, DFlash / DSpark, saved by
specdraft.models.save_block_drafter: DeepSpec's layout) or "demo" (the shipped EAGLE-3
head). A block drafter is scored on the block anchored after every start (its first
--steps drafts, all block_size by default), and the report adds the acceptance
length as DeepSpec's evaluator counts it (accepted drafts + 1 per block). --budget B
adds budgeted verification: the drafts accepted per start when B drafts per start
are verified, those of largest expected gain first, against fixed K verifying as
many (training.budget_curve). A head saved without its embedding (or
lm_head) takes the target's: pass --target (a folder, or "demo" for the shipped
target; for HEAD "demo" the shipped target is the default). The step is compiled
(fullgraph, dynamic shapes: one graph for every shard), unless --eager. Exit status
2 on bad input, with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from itertools import pairwise
from pathlib import Path

from specdraft.__main__ import (
    DEVICE_HELP,
    NO_PROGRESS_HELP,
    ArgumentParser,
    add_threads_option,
    announce_first_call,
    check_device,
    check_safetensors,
    check_threads,
    check_writable,
    is_bad_input,
    load_model_folder,
    model_folder,
    run_reporting_errors,
    use_threads,
)

# No models, training or generation code above: they load after the arguments are
# parsed (in main), so --help and argument errors answer without them.


def build_parser(prog: str = "python -m specdraft.eval") -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("head", help='draft-head folder (EAGLE, MTP, or a DFlash / DSpark block drafter), or '
                        '"demo" for the shipped EAGLE-3 head')  # fmt: skip
    parser.add_argument("data", type=Path, help="a folder of shards, or one .safetensors shard")
    parser.add_argument("--steps", type=int, help="draft steps K per start (default 3; a block drafter: its "
                        "block_size)")  # fmt: skip
    parser.add_argument("--temperature", type=float, default=0.0, help="for Σ min(p, q), >= 0 (default 0: greedy)")
    parser.add_argument("--top-k", type=int, default=0, help="a request's top-k for Σ min(p, q): both distributions "
                        "truncated, the draft sampled inside (default 0: off; ignored when greedy)")  # fmt: skip
    parser.add_argument("--top-p", type=float, default=1.0, help="a request's top-p, in (0, 1] (default 1: off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="a request's min-p, in [0, 1] (default 0: off)")
    parser.add_argument("--tokens", choices=("draft", "data"), default="draft",
                        help="feed the head's own drafts (as served; default) or the data (teacher forcing)")  # fmt: skip
    parser.add_argument("--method", choices=("eagle", "eagle3", "mtp"),
                        help='head kind (default: from the folder; HEAD "demo" is eagle3)')  # fmt: skip
    parser.add_argument("--target", help='target folder to share the embedding / lm_head from, or "demo"')
    parser.add_argument("--divergence", action="store_true", help="also report cross-entropy and KL per step")
    parser.add_argument("--budget", type=float, help="also report budgeted verification: accepted drafts per start "
                        "when BUDGET drafts per start (0 < BUDGET <= K, a mean) are verified, those of largest "
                        "expected gain first, against fixed K verifying as many")  # fmt: skip
    parser.add_argument("--plot", type=Path, help="write a PNG of acceptance per step (needs matplotlib); its "
                        "folder is created if missing")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the metrics and timings as JSON; its folder is created "
                        "if missing")  # fmt: skip
    parser.add_argument(
        "--max-batch-tokens", type=int, default=1024, help="evaluate each shard in groups of whole sequences of at "
        "most this many tokens (default 1024; 0: whole shards). The sums do not change; on CPU the dense "
        "attention's cost grows with the square of a group's size",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help=DEVICE_HELP)
    parser.add_argument("--eager", action="store_true", help="do not compile the evaluation step")
    add_threads_option(parser)
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    return parser


def parse_args(argv=None, prog: str = "python -m specdraft.eval") -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if (args.steps is not None and args.steps < 1) or args.max_batch_tokens < 0:
        parser.error("--steps must be >= 1 and --max-batch-tokens >= 0")
    check_threads(parser, args)
    if not args.temperature >= 0:  # NaN too
        parser.error(f"--temperature must be >= 0, got {args.temperature}")
    if not 0.0 < args.top_p <= 1.0:  # NaN too
        parser.error(f"--top-p must be in (0, 1] (1: off), got {args.top_p}")
    if not 0.0 <= args.min_p <= 1.0:
        parser.error(f"--min-p must be in [0, 1] (0: off), got {args.min_p}")
    if args.budget is not None and not args.budget > 0:  # NaN too
        parser.error(f"--budget must be > 0 drafts verified per start, got {args.budget}")
    if args.head == "demo" and args.method not in (None, "eagle3"):
        parser.error(f'--method {args.method}: HEAD "demo" is the shipped EAGLE-3 head (--method eagle3 or none)')
    return args


def load_head(args, device):
    """The head, with the target's embedding / lm_head shared where it has none."""
    from specdraft.models import load_draft_model
    from specdraft.models.block_config import is_block_folder
    from specdraft.models.block_loading import load_block_drafter
    from specdraft.models.target_loading import load_target_model

    demo = args.head == "demo"
    folder = model_folder("HEAD", args.head, "eagle3")
    method = "eagle3" if demo else args.method
    if not demo and load_model_folder("HEAD", folder, lambda: is_block_folder(folder)):
        if method is not None:
            raise ValueError(f"--method {method}: HEAD {folder} is a block drafter (DFlash / DSpark); drop --method")
        head = load_model_folder("HEAD", folder, lambda: load_block_drafter(folder, device=device)).eval()
    else:
        head = load_model_folder("HEAD", folder, lambda: load_draft_model(folder, method=method, device=device)).eval()
    target = "demo" if demo and args.target is None else args.target
    if head.missing_weights:
        if target is None:
            raise ValueError(
                f"head: the checkpoint has no {', '.join(sorted(head.missing_weights))}; pass --target TARGET_FOLDER "
                "to share the target's"
            )
        target_folder = model_folder("--target", target, "target")
        head.share_from(load_model_folder("--target", target_folder,
                                          lambda: load_target_model(target_folder, device=device)))  # fmt: skip
    return head


def check_shards(paths: list[Path], head) -> None:
    """The shards' recorded aux layers against the head's config, where both say."""
    from specdraft.training.shards import shard_metadata

    if head.draft_loop == "block":
        want = head.block.aux_layers
    else:
        want = (head.config.extra.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if want is None:
        return
    for path in paths:
        recorded = shard_metadata(path).get("aux_layers")
        if recorded is not None and json.loads(recorded) and list(json.loads(recorded)) != list(want):
            raise ValueError(
                f"data: {path} holds the target's layers {json.loads(recorded)}; the head fuses {list(want)}"
            )


def main(argv=None, prog: str = "python -m specdraft.eval") -> int:
    args = parse_args(argv, prog)
    # Under torchrun, rank 0 reports an error, naming the rank that failed.
    return run_reporting_errors(run, args, quiet=os.environ.get("RANK", "0") != "0")


def run(args: argparse.Namespace) -> int:
    """One process, or one rank of `torchrun` (training.distributed): the rank's share
    of the shards, the sums all-reduced, the report on rank 0."""
    from specdraft.training.distributed import Ranks, init_process_group, rank_device, ranks_from_env

    ranks = ranks_from_env()
    if ranks is None:
        device = check_device(args.device)
        use_threads(args.threads, device)
        return evaluate_and_report(args, Ranks(), device)
    import torch.distributed as dist

    device = rank_device(check_device(args.device), ranks)
    use_threads(args.threads, device)
    init_process_group(device, ranks)
    try:
        return evaluate_and_report(args, ranks, device)
    finally:
        dist.destroy_process_group()


def longest_sequence(path: Path) -> int:
    """The longest sequence of a shard, from its cu_seqlens (no other tensor is read;
    0 where the shard has no input_ids: load_batch names what is missing)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        if "input_ids" not in f.keys():
            return 0
        if "cu_seqlens" not in f.keys():
            shape = f.get_slice("input_ids").get_shape()
            return int(shape[0]) if shape else 0
        bounds = f.get_tensor("cu_seqlens").tolist()
    return max((b - a for a, b in pairwise(bounds)), default=0)


def check_steps(steps: int, paths: list[Path]) -> None:
    """--steps within the data: draft step k scores the token k + 1 past its start,
    inside the start's sequence, so K must be below the longest sequence."""
    longest = max(longest_sequence(p) for p in paths)
    if longest and steps >= longest:
        raise ValueError(f"--steps {steps}: must be <= {longest - 1} (the longest sequence in DATA holds {longest} "
                         "tokens; draft step k needs k + 1 of one sequence)")  # fmt: skip


def head_steps(steps: int | None, head) -> int:
    """--steps, or its default for the head: 3, a block drafter's block_size; a
    block drafter's never above it."""
    size = head.block_size if head.draft_loop == "block" else None
    if steps is None:
        return 3 if size is None else size
    if size is not None and steps > size:
        raise ValueError(f"--steps {steps}: a block drafter drafts at most its block_size = {size} tokens")
    return steps


def deepspec_line(metrics) -> str:
    """A block drafter's acceptance length as DeepSpec's evaluator counts it."""
    return (f"acceptance length as DeepSpec counts it (accepted drafts + 1, per block): "
            f"{float(metrics.acceptance_length) + 1:.4f}")  # fmt: skip


def ranked_by(head) -> str:
    """What budgeted verification ranks the head's drafts by."""
    if getattr(head, "confidence_head", None) is not None:
        return "its confidence head"
    return "the draft's confidence"


def check_outputs(args: argparse.Namespace) -> None:
    if args.plot is not None:
        from specdraft.training.report import pyplot

        try:
            pyplot()
        except ModuleNotFoundError as error:
            raise ValueError(f"--plot: {error}") from None
        check_writable("--plot", args.plot)
    if args.json is not None:
        check_writable("--json", args.json)


def after_first(timing: dict) -> str:
    """The steady rate after the first shard (the compile), where there is one."""
    if timing["after_first_tokens"] <= 0 or timing["after_first_s"] <= 0:
        return ""
    return f"; after it: {timing['after_first_tokens'] / timing['after_first_s']:.0f} tokens/s"


def truncation(args: argparse.Namespace) -> dict:
    """--top-k, --top-p, --min-p as DraftEvaluator's keywords."""
    return {"top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p}


def sampling_note(args: argparse.Namespace) -> str:
    """The header's sampling: nothing when greedy without truncation."""
    from specdraft.training.report import sampling_label

    truncated = args.top_k > 0 or args.top_p < 1 or args.min_p > 0
    if args.temperature > 0:
        return f", {sampling_label(args.temperature, **truncation(args))}"
    return ", greedy (--top-k / --top-p / --min-p ignored)" if truncated else ""


def evaluate_and_report(args: argparse.Namespace, ranks, device) -> int:
    from specdraft.training.distributed import all_ranks_or_none, all_reduce_timing, shard_tokens, share_shards
    from specdraft.training.evaluate import DraftEvaluator, evaluate
    from specdraft.training.metrics import finalize, reduce, zero_sums
    from specdraft.training.report import budget_points, format_budget, format_table, plot_acceptance
    from specdraft.training.shards import shard_paths

    with all_ranks_or_none(ranks, "setup", is_bad_input):
        if ranks.is_main:  # the outputs and the cheap checks before the evaluation, not after it
            check_outputs(args)
        paths = shard_paths(args.data)
        check_safetensors("DATA", paths)
        if args.steps is not None:  # before the head loads: a bad --steps answers at once
            check_steps(args.steps, paths)
        mine = [paths[i] for i in share_shards([shard_tokens(p) for p in paths], ranks.world_size)[ranks.rank]]
        head = load_head(args, device)
        steps = head_steps(args.steps, head)
        if args.steps is None:
            check_steps(steps, paths)
        if args.budget is not None and args.budget > steps:
            raise ValueError(f"--budget {args.budget:g}: at most K = {steps} drafts per start can be verified")
        check_shards(paths, head)
        evaluator = DraftEvaluator(head, num_steps=steps, temperature=args.temperature, **truncation(args),
                                   tokens=args.tokens, divergence=args.divergence, budget=args.budget is not None,
                                   compile=not args.eager)  # fmt: skip
    progress = ranks.is_main and not args.no_progress
    if not args.eager and progress:
        evaluator.step = announce_first_call(evaluator.step, "the evaluation step", device)
    with all_ranks_or_none(ranks, "evaluate", is_bad_input):
        if mine:
            sums, timing = evaluate(evaluator, mine, max_batch_tokens=args.max_batch_tokens or None, progress=progress)
        else:  # more ranks than shards
            sums = zero_sums(steps, args.divergence, device, budget=args.budget is not None)
            timing = dict.fromkeys(("tokens", "seconds", "first_batch_s", "after_first_tokens", "after_first_s"), 0)
    sums, timing = reduce(sums), all_reduce_timing(timing, device)
    if not ranks.is_main:
        return 0
    metrics = finalize(sums)
    on = f", {ranks.world_size} ranks" if ranks.distributed else ""
    print(f"{args.head} on {args.data}: {len(paths)} shards, {timing['tokens']} tokens, K = {steps}, "
          f"{'compiled' if not args.eager else 'eager'}, {evaluator.loop} loop, tokens={args.tokens}{on}"
          f"{sampling_note(args)}")  # fmt: skip
    print(format_table(metrics, sums, args.temperature, **truncation(args)))
    if evaluator.loop == "block":
        print(deepspec_line(metrics))
    points = None
    if args.budget is not None:
        points = budget_points(metrics, sums, args.budget)
        print(format_budget(points, args.temperature, args.budget, ranked_by(head)))
    print(f"{timing['tokens_per_s']:.0f} tokens/s over {timing['seconds']:.1f} s "
          f"(the first shard, compile included: {timing['first_batch_s']:.1f} s{after_first(timing)})")  # fmt: skip
    if args.plot is not None:
        title = f"{args.head}, K = {steps}"
        print(f"wrote {plot_acceptance(metrics, args.plot, title, args.temperature, **truncation(args), sums=sums)}")
    if args.json is not None:
        record = {name: value.tolist() for name, value in metrics._asdict().items()}
        record |= {"sums": {name: value.tolist() for name, value in sums._asdict().items()}, "timing": timing,
                   "sampling": {"temperature": args.temperature, **truncation(args)}}  # fmt: skip
        if evaluator.loop == "block":
            record["deepspec_acceptance_length"] = float(metrics.acceptance_length) + 1
        if points is not None:
            record["budget"] = [point._asdict() for point in points]
        args.json.write_text(json.dumps(record, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
