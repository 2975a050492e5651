"""Compile time of the demo's compiled functions, cold and warm, on CPU or CUDA:
`propose` (EagleProposer, EAGLE-3 head, K draft steps, the prefill-shaped call) and
one generate iteration (SpeculativeDecoder.iteration, plain and speculative: target
verify + rejection sampling + the padded propose), at the demo's sizes (the shipped
4 x 256 target and EAGLE-3 head, its Python prompts, K = 3).

    python benchmarks/bench_compile.py                 # CPU, the demo's options
    python benchmarks/bench_compile.py --device cuda
    python benchmarks/bench_compile.py --inductor-defaults   # Inductor's own CPU defaults

Each measurement runs in a fresh process. cold: an empty Inductor / Triton cache
folder (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR under a new temp folder); warm: a
second process on the folder the cold one filled (FX graph cache and AOTAutograd
cache, on by default). Compile time = the first compiled call (Dynamo trace, AOT,
Inductor codegen, kernel builds) minus nothing: one execution of a few ms is
included. Split: Dynamo (tracing), backend (AOT + Inductor, of which the wait for
the C++ / Triton kernel builds). With Inductor's CPU defaults the first compile of
a process also runs its vector-ISA probe (test builds, a few seconds cold); the
demo's CPU options skip it. Inductor's precompiled header lives in its default
folder whatever the cache folder, so it is built once per machine and reused by
"cold" runs. The CPU builds run on torch's compile worker pool; on a shared machine
the load average (printed) moves these numbers a lot.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = "--child"


def child(what: str, device: str, k: int, defaults: bool) -> dict:
    import torch

    from specdraft.demo import PROMPTS, build_decoders, compile_options, encode

    report = {}
    if device == "cpu":
        torch.set_num_threads(1)  # as the demo
    options = True if defaults else compile_options(device, True)
    plain, spec = build_decoders(device, k, len(PROMPTS), options)
    decoder = plain if what == "plain iteration" else spec
    prompts, requests = decoder.requests(encode(PROMPTS), 32, None, None)
    with torch.no_grad():
        if what == "propose":
            from specdraft.generation.verify import prompt_batch

            token_ids, positions, metadata, _ = prompt_batch(
                prompts, requests.block_table, decoder.block_size, decoder.reach
            )
            _, draft_hidden = decoder.run_target(token_ids, positions, metadata)
            next_tokens = token_ids.index_select(0, metadata.query_start_loc[1:].long() - 1)
            opts = {"dynamic": False} if options is True else {"dynamic": False, **options}
            fn = torch.compile(spec.proposer.propose, fullgraph=True, **opts)

            def call():
                return fn(token_ids, positions, draft_hidden, next_tokens, metadata, requests.sampling)
        else:
            state = decoder.prefill(prompts, requests)

            def call():
                return decoder.compiled["iteration"](state, requests)

        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        start = time.perf_counter()
        call()
        sync()
        report["compile_s"] = time.perf_counter() - start
    from torch._dynamo.utils import compilation_time_metrics as metrics

    def top(key):  # the outermost of nested timings of one key
        return max(metrics.get(key, [0.0]))

    report["backend_s"] = top("OutputGraph.call_user_compiler")
    report["dynamo_s"] = top("_compile.compile_inner") - report["backend_s"]
    report["kernel_wait_s"] = sum(metrics.get("async_compile.wait", [0.0]))
    return report


def measure(what: str, device: str, k: int, defaults: bool, cache: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"))
    cmd = [sys.executable, __file__, CHILD, what, "--device", device, "--k", str(k)]
    if defaults:
        cmd.append("--inductor-defaults")
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{what} on {device} failed:\n{out.stderr[-4000:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    report["load"] = load
    return report


def fmt(report: dict, key: str) -> str:
    return f"{report[key]:.1f}" if key in report else "-"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--what", nargs="+", default=["propose", "speculative iteration", "plain iteration"])
    parser.add_argument("--inductor-defaults", action="store_true", help="plain torch.compile, not the demo's options")
    parser.add_argument(CHILD, dest="child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.device, args.k, args.inductor_defaults)))
        return

    import torch

    from specdraft.demo import compile_options

    options = (
        "torch.compile defaults" if args.inductor_defaults else f"the demo's: {compile_options(args.device, True)}"
    )
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{os.cpu_count()} CPU cores, 1 torch thread"
    print(f"Compile time, demo sizes (K = {args.k}); {args.device}: {where}; torch {torch.__version__}")
    print(f"options: fullgraph=True, dynamic=False, {options}; seconds; load = 1-min load average at start\n")
    headers = [
        "function",
        "cold s",
        "Dynamo s",
        "backend s",
        "of which kernel builds s",
        "warm s",
        "load (cold / warm)",
    ]
    rows = []
    for what in args.what:
        with tempfile.TemporaryDirectory(prefix="specdraft-compile-") as cache:
            cold = measure(what, args.device, args.k, args.inductor_defaults, cache)
            warm = measure(what, args.device, args.k, args.inductor_defaults, cache)
        rows.append([what, fmt(cold, "compile_s"), fmt(cold, "dynamo_s"), fmt(cold, "backend_s"),
                     fmt(cold, "kernel_wait_s"), fmt(warm, "compile_s"), f"{cold['load']:.1f} / {warm['load']:.1f}"])  # fmt: skip
        print(f"  {what}: cold {cold['compile_s']:.1f} s, warm {warm['compile_s']:.1f} s", file=sys.stderr, flush=True)
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
