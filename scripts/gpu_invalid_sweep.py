"""GPU sweep of invalid inputs: unchecked mode must never read or write outside its
tensors, nor kill the CUDA context, whatever the values.

Every op of specdraft.ops gets Hypothesis-drawn cases of every rule of
specdraft.testing.OP_RULES (one rule broken per case), and every proposer path
(EAGLE / EAGLE-3 / MTP: propose, its padded form, propose_padded, propose_unpadded;
parallel drafting; multi-layer; multi-group; autoregressive) gets drawn batches of
every rule of BATCH_RULES. After each case:

- the CUDA context must still work: torch.cuda.synchronize() and a trivial kernel
  (CUDA_LAUNCH_BLOCKING=1, set here before torch loads, so an error surfaces at its
  own launch); a lost context ends the sweep, reported as such;
- no exception: unchecked mode raises nothing for a bad value;
- the buffers an op writes sit inside larger ones with sentinel guard rows, which
  must survive; a proposer's KV caches must change only in the slots its batch
  names (its block table's blocks, its slot mapping's slots);
- documented results: draft tokens in [0, V), rejection tokens in [-1, V) with
  counts in [0, K], copy_and_expand_inputs' new_token_indices in [0, T_out).

Results: $OUT/gpu_invalid_sweep/results.json (OUT defaults to ./out) and a table on
stdout. Exit status 1 if any case failed.

    python scripts/gpu_invalid_sweep.py                       # everything, 8 cases a rule
    python scripts/gpu_invalid_sweep.py --examples 30 --seed 1
    python scripts/gpu_invalid_sweep.py --device cpu --examples 2   # a dry run of the harness

Under compute-sanitizer (reads out of bounds too, and races), where the machine has
it (`which compute-sanitizer`, or /usr/local/cuda/bin/compute-sanitizer):

    compute-sanitizer --tool memcheck --error-exitcode 99 \\
        python scripts/gpu_invalid_sweep.py --no-proposers --examples 3 --tag memcheck_ops
    compute-sanitizer --tool memcheck --error-exitcode 99 \\
        python scripts/gpu_invalid_sweep.py --no-ops --examples 1 --tag memcheck_proposers
    compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 99 \\
        python scripts/gpu_invalid_sweep.py --ops shift_and_cache_1d,shift_and_cache_hidden \\
        --no-proposers --examples 5 --tag racecheck

`--sanitize` runs both of those itself when compute-sanitizer is found (and says so
in the JSON when it is not), recording each one's ERROR SUMMARY.
"""

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")

import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from specdraft.testing import BATCH_RULES, OP_RULES, invalid_draft_batches, invalid_op_cases  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from invalid_sweep_proposers import PROPOSER_KINDS, ProposerRig  # noqa: E402

SANITIZED_OPS = ("shift_and_cache_1d", "shift_and_cache_hidden")
FATAL = re.compile(r"CUDA error|illegal memory|device-side assert|unspecified launch failure|misaligned address")


class ContextLost(Exception):
    pass


class Tally:
    """Cases and failures, per op (or proposer path) and per rule."""

    def __init__(self) -> None:
        self.cases: Counter = Counter()
        self.failures: dict[str, Counter] = defaultdict(Counter)
        self.by_rule: Counter = Counter()
        self.examples: list[dict] = []  # the first failures, in full
        self.context_lost: str | None = None

    def record(self, unit: str, rule: str, failure: str | None, detail: str = "") -> None:
        self.cases[unit] += 1
        self.by_rule[f"{unit} | {rule}"] += 1
        if failure is not None:
            self.failures[unit][failure] += 1
            if len(self.examples) < 50:
                self.examples.append({"unit": unit, "rule": rule, "failure": failure, "detail": detail[:2000]})


def context_alive(device: str) -> bool:
    if device != "cuda":
        return True
    try:
        torch.cuda.synchronize()
        x = torch.arange(4, device=device, dtype=torch.float32)
        return float((x + 1).sum().item()) == 10.0
    except Exception:  # any error here means the context is gone
        return False


def guarded_run(tally: Tally, device: str, unit: str, rule: str, body) -> None:
    """Run one case: body() returns None or a failure description."""
    if tally.context_lost:
        return
    try:
        failure = body()
        detail = ""
    except Exception as error:
        failure, detail = f"exception: {type(error).__name__}", traceback.format_exc()
        if FATAL.search(str(error)):
            tally.context_lost = f"{unit} | {rule}: {error}"
    if not context_alive(device):
        tally.context_lost = tally.context_lost or f"{unit} | {rule}"
        failure = failure or "context lost"
    tally.record(unit, rule, failure, detail)
    if tally.context_lost:
        raise ContextLost(tally.context_lost)


# ------------------------------------------------------------------------------ ops


def op_contract(case, result) -> str | None:
    """The documented result of an op on invalid input, where one is documented."""
    if case.op == "draft_sample":
        vocab = len(case.tensors["logits"][1][0])
        if not bool(((result >= 0) & (result < vocab)).all()):
            return "draft token outside [0, V)"
    if case.op == "rejection_sample":
        tokens, counts = result
        vocab, k = len(case.tensors["target_logits"][1][0][0]), len(case.tensors["draft_tokens"][1][0])
        if not bool(((tokens >= -1) & (tokens < vocab)).all()) or not bool(((counts >= 0) & (counts <= k)).all()):
            return "rejection output outside [-1, V) / counts outside [0, K]"
    if case.op == "copy_and_expand_inputs":
        out = result.new_token_indices
        if out.numel() and not bool(((out >= 0) & (out < result.input_ids.shape[0])).all()):
            return "new_token_indices outside [0, T_out)"
    return None


def sweep(strategy, examples: int, seed_value: int, handle) -> None:
    """handle(case) for `examples` cases drawn from strategy (generation only: a
    failure is tallied, never raised, so Hypothesis never shrinks on a device)."""

    @seed(seed_value)
    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=strategy)
    def run(case):
        handle(case)

    run()


def run_op_case(tally: Tally, device: str, case) -> None:
    def body():
        result, _, intact = case.run(device, guard=4)
        if device == "cuda":
            torch.cuda.synchronize()
        if not intact:
            return "guard rows overwritten"
        return op_contract(case, result)

    guarded_run(tally, device, case.op, case.rule, body)


def sweep_ops(tally: Tally, device: str, ops: list[str], examples: int, seed_value: int) -> None:
    for op in ops:
        for rule in OP_RULES[op]:
            sweep(invalid_op_cases(op, rule), examples, seed_value, functools.partial(run_op_case, tally, device))


# ------------------------------------------------------------------------ proposers


def run_batch_case(tally: Tally, device: str, rig: ProposerRig, case) -> None:
    for path in rig.paths(case):
        guarded_run(tally, device, f"{rig.kind}.{path}", case.rule, functools.partial(rig.check, case, path))


def sweep_proposers(tally: Tally, device: str, kinds: list[str], examples: int, seed_value: int) -> None:
    for kind in kinds:
        rig = ProposerRig(kind, device)
        for rule in BATCH_RULES:
            strategy = invalid_draft_batches(**rig.batch_params, rule=rule)
            sweep(strategy, examples, seed_value, functools.partial(run_batch_case, tally, device, rig))


# ------------------------------------------------------------------------- sanitizer


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/compute-sanitizer")
    return str(default) if default.exists() else None


def run_sanitizers(args) -> dict:
    tool_path = find_sanitizer()
    if tool_path is None:
        return {"available": False, "note": "compute-sanitizer not found; the sweep ran with CUDA_LAUNCH_BLOCKING=1 "
                "and a context check after every case instead"}  # fmt: skip
    script = [sys.executable, str(Path(__file__).resolve()), "--out", args.out, "--seed", str(args.seed)]
    # Under the sanitizer every launch is slow: the ops get a few cases a rule, the
    # proposers (hundreds of launches a call) one, on the kinds whose paths differ most.
    runs = {
        "memcheck_ops": ["--tool", "memcheck", *script, "--no-proposers", "--examples", "3", "--tag", "memcheck_ops"],
        "memcheck_proposers": ["--tool", "memcheck", *script, "--no-ops", "--examples", "1", "--proposers",
                               "eagle,parallel,multi_layer,autoregressive", "--tag", "memcheck_proposers"],
        "racecheck": ["--tool", "racecheck", "--racecheck-report", "all", *script, "--ops", ",".join(SANITIZED_OPS),
                      "--no-proposers", "--examples", "4", "--tag", "racecheck"],
    }  # fmt: skip
    out = {"available": True, "path": tool_path}
    for name, tool_args in runs.items():
        start = time.time()
        proc = subprocess.run([tool_path, *tool_args], capture_output=True, text=True)
        summary = re.findall(r"ERROR SUMMARY: (\d+) error", proc.stdout + proc.stderr)
        out[name] = {
            "command": " ".join([tool_path, *tool_args]),
            "exit_status": proc.returncode,
            "error_summary": [int(n) for n in summary],
            "seconds": round(time.time() - start, 1),
            "tail": (proc.stdout + proc.stderr)[-3000:],
        }
    return out


# ------------------------------------------------------------------------------ main


def table(tally: Tally) -> str:
    rows = [("op / proposer path", "cases", "failures")]
    for unit in sorted(tally.cases):
        failed = sum(tally.failures[unit].values())
        what = ", ".join(f"{k}: {v}" for k, v in tally.failures[unit].items())
        rows.append((unit, str(tally.cases[unit]), f"{failed}" + (f" ({what})" if what else "")))
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, width, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in width))
    total, failed = sum(tally.cases.values()), sum(sum(c.values()) for c in tally.failures.values())
    lines.append(f"total: {total} cases, {failed} failures; CUDA context "
                 f"{'LOST: ' + tally.context_lost if tally.context_lost else 'alive throughout'}")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--examples", type=int, default=8, help="Hypothesis cases per rule (per op / proposer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ops", default=",".join(OP_RULES), help="comma-separated ops (default: all)")
    parser.add_argument("--proposers", default=",".join(PROPOSER_KINDS), help="comma-separated proposer kinds")
    parser.add_argument("--no-ops", action="store_true")
    parser.add_argument("--no-proposers", action="store_true")
    parser.add_argument("--sanitize", action="store_true", help="also run memcheck / racecheck subprocesses")
    parser.add_argument("--tag", default="sweep", help="name of this run's JSON file")
    parser.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu for a dry run of the harness", file=sys.stderr)
        return 2
    ops = [] if args.no_ops else [op for op in args.ops.split(",") if op]
    kinds = [] if args.no_proposers else [k for k in args.proposers.split(",") if k]
    unknown = [op for op in ops if op not in OP_RULES] + [k for k in kinds if k not in PROPOSER_KINDS]
    if unknown:
        parser.error(f"unknown ops / proposers: {unknown}")

    tally, start = Tally(), time.time()
    try:
        sweep_ops(tally, args.device, ops, args.examples, args.seed)
        sweep_proposers(tally, args.device, kinds, args.examples, args.seed)
    except ContextLost:
        pass
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda_launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING"),
        "examples_per_rule": args.examples,
        "seed": args.seed,
        "seconds": round(time.time() - start, 1),
        "cases": dict(tally.cases),
        "failures": {unit: dict(c) for unit, c in tally.failures.items() if c},
        "cases_by_rule": dict(tally.by_rule),
        "context_lost": tally.context_lost,
        "failure_examples": tally.examples,
    }
    if args.sanitize:
        result["compute_sanitizer"] = run_sanitizers(args)
    out_dir = Path(args.out) / "gpu_invalid_sweep"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{args.tag}.json").write_text(json.dumps(result, indent=2))
    print(table(tally))
    if args.sanitize:
        for name, run in result["compute_sanitizer"].items():
            if isinstance(run, dict):
                print(f"compute-sanitizer {name}: exit {run['exit_status']}, ERROR SUMMARY {run['error_summary']}")
        if not result["compute_sanitizer"]["available"]:
            print(result["compute_sanitizer"]["note"])
    print(f"results: {out_dir / (args.tag + '.json')}")
    failed = bool(result["failures"]) or tally.context_lost is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
