"""Compile time of the demo's compiled functions, cold and warm, on CPU or CUDA:
`propose` (EagleProposer, EAGLE-3 head, K draft steps, the prefill-shaped call) and
one generate iteration (SpeculativeDecoder.iteration, plain and speculative: target
verify + rejection sampling + the padded propose), at the demo's sizes (the shipped
4 x 256 target and EAGLE-3 head, its Python prompts, K = 3).

    python benchmarks/bench_compile.py                 # CPU, the demo's options
    python benchmarks/bench_compile.py --device cuda
    python benchmarks/bench_compile.py --inductor-defaults   # Inductor's own CPU defaults
    python benchmarks/bench_compile.py --inductor-defaults --dynamic --what propose   # an engine's dynamic=True propose

Each measurement runs in a fresh process. cold: an empty Inductor / Triton cache
folder (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR under a new temp folder); warm: a
second process on the folder the cold one filled (FX graph cache and AOTAutograd
cache, on by default); from artifacts (--artifacts): a third process on a new, empty
cache folder that first loads the file the cold one wrote with
torch.compiler.save_cache_artifacts (torch.compiler.load_cache_artifacts: how
compiled code moves to another machine or container). Compile time = the first compiled call (Dynamo trace, AOT,
Inductor codegen, kernel builds) minus nothing: one execution of a few ms is
included. Split: Dynamo (tracing), backend (AOT + Inductor, of which the wait for
the C++ / Triton kernel builds). The first compile of a process also runs Inductor's
vector-ISA probe (test builds, ~12 s on a cold cache folder, then a cached load of
~1 s), reported apart ("first compile of the process"), not in the cold figure. Inductor's precompiled header lives in its default
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

from record import append_table

CHILD = "--child"


def build_8b_decoders(device: str, k: int, options, num_reqs: int = 8, max_model_len: int = 512, layers: int = 2):
    """(plain, speculative) decoders over bench_generate.py's Llama-3-8B-shaped
    target (`layers` decoder layers, bf16, random weights; on the CPU its smoke
    sizes, fp32) and 8B-shaped EAGLE-3 head."""
    import torch
    from bench_generate import Device, build_8b

    from specdraft.config import SpeculativeConfig
    from specdraft.demo import BLOCK_SIZE
    from specdraft.generation import SpeculativeDecoder, num_kv_blocks
    from specdraft.proposers import EagleProposer

    target, head = build_8b(Device(smoke=device == "cpu"), layers, 32000 if device == "cuda" else 256)
    config = SpeculativeConfig(method="eagle3", num_speculative_tokens=k, max_model_len=max_model_len,
                               block_size=BLOCK_SIZE)  # fmt: skip
    caches = head.allocate_kv_caches(num_kv_blocks(num_reqs, max_model_len, k, BLOCK_SIZE), BLOCK_SIZE)
    proposer = EagleProposer(head, config, caches)
    plain = SpeculativeDecoder(target, None, max_model_len=max_model_len, block_size=BLOCK_SIZE, compile=options)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, target.config.vocab_size, (32,), generator=gen).tolist() for _ in range(num_reqs)]
    return plain, SpeculativeDecoder(target, proposer, compile=options), prompts


def first_compile_of_the_process(device: str, options) -> float:
    """Seconds of one tiny compiled function, with the same options, run first: the
    compiler stack's one-time cost in a process (importing Dynamo, Inductor and
    their dependencies, starting the compile workers), paid once whatever is
    compiled after it, so it is reported apart from the function's own time."""
    import torch

    def tiny(x):
        return torch.nn.functional.silu(x) * 2 + 1

    opts = {} if options is True else dict(options)
    x = torch.randn(64, device=device)
    start = time.perf_counter()
    torch.compile(tiny, fullgraph=True, dynamic=False, **opts)(x)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def dynamo_traces() -> int:
    """Dynamo's attempts at frames so far in this process (a restart is a second one)."""
    from torch._dynamo.utils import compilation_time_metrics as metrics

    return sum(len(runs) for name, runs in metrics.items() if name.startswith("compile_attempt_"))


def child(what: str, device: str, k: int, defaults: bool, shape: str, precompile: bool,
          save_to: str | None = None, load_from: str | None = None, layers: int = 2, dynamic: bool = False) -> dict:  # fmt: skip
    import torch

    from specdraft.demo import PROMPTS, build_decoders, compile_options, encode

    report = {}
    if device == "cpu":
        torch.set_num_threads(1)  # as the demo
    if precompile:  # Dynamo's own cache: guards and bytecode saved, a warm start skips tracing
        torch._dynamo.config.caching_precompile = True
    options = True if defaults else compile_options(device, True)
    if shape == "8b":
        plain, spec, prompts = build_8b_decoders(device, k, options, layers=layers)
    else:
        plain, spec = build_decoders(device, k, len(PROMPTS), options)
        prompts = encode(PROMPTS)
    decoder = plain if what == "plain iteration" else spec
    prompts, requests = decoder.requests(prompts, 32, None, None)
    report["stack_s"] = first_compile_of_the_process(device, options)
    traces_before = dynamo_traces()  # the tiny function's
    if load_from:
        with open(load_from, "rb") as f:
            start = time.perf_counter()
            torch.compiler.load_cache_artifacts(f.read())
            report["load_s"] = time.perf_counter() - start
    proposer = spec.proposer
    if what == "probabilistic propose":  # seeded Gumbel drafts with their probabilities, at temperature 0.7
        import dataclasses

        from specdraft.config import SamplingParams
        from specdraft.proposers import EagleProposer

        config = dataclasses.replace(proposer.config, draft_sampling="probabilistic", return_probs="probs")
        proposer = EagleProposer(proposer.model, config, proposer.kv_caches)
        num = len(prompts)
        requests = dataclasses.replace(requests, sampling=SamplingParams(
            torch.full((num,), 0.7, device=device), torch.arange(num, device=device)), all_greedy=False)  # fmt: skip
    with torch.no_grad():
        if what in ("propose", "probabilistic propose"):
            from specdraft.generation.verify import prompt_batch

            token_ids, positions, metadata, _ = prompt_batch(
                prompts, requests.block_table, decoder.block_size, decoder.reach
            )
            _, draft_hidden = decoder.run_target(token_ids, positions, metadata)
            next_tokens = token_ids.index_select(0, metadata.query_start_loc[1:].long() - 1)
            opts = {"dynamic": dynamic} if options is True else {"dynamic": dynamic, **options}
            fn = torch.compile(proposer.propose, fullgraph=True, **opts)

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
    if save_to:
        artifacts = torch.compiler.save_cache_artifacts()
        with open(save_to, "wb") as f:
            f.write(artifacts[0] if artifacts else b"")
        report["artifact_bytes"] = os.path.getsize(save_to)
    from torch._dynamo.utils import compilation_time_metrics as metrics

    def top(key):  # the outermost of nested timings of one key
        return max(metrics.get(key, [0.0]))

    report["backend_s"] = top("OutputGraph.call_user_compiler")
    report["dynamo_s"] = top("_compile.compile_inner") - report["backend_s"]
    report["kernel_wait_s"] = sum(metrics.get("async_compile.wait", [0.0]))
    report["traces"] = dynamo_traces() - traces_before
    return report


def measure(what: str, args, cache: str, save_to: str | None = None, load_from: str | None = None) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"))
    cmd = [
        sys.executable,
        __file__,
        CHILD,
        what,
        "--device",
        args.device,
        "--k",
        str(args.k),
        "--shape",
        args.shape,
        "--layers",
        str(args.layers),
    ]
    if args.inductor_defaults:
        cmd.append("--inductor-defaults")
    if args.precompile:
        cmd.append("--precompile")
    if args.dynamic:
        cmd.append("--dynamic")
    if save_to:
        cmd += ["--save-artifacts", save_to]
    if load_from:
        cmd += ["--load-artifacts", load_from]
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{what} on {args.device} failed:\n{out.stderr[-4000:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    report["load"] = load
    return report


def fmt(report: dict, key: str) -> str:
    return f"{report[key]:.1f}" if key in report else "-"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--what", nargs="+", default=["propose", "probabilistic propose", "speculative iteration",
                                                      "plain iteration"])  # fmt: skip
    parser.add_argument("--inductor-defaults", action="store_true", help="plain torch.compile, not the demo's options")
    parser.add_argument("--shape", choices=["demo", "8b"], default="demo", help="the demo pair or 8B-shaped models")
    parser.add_argument("--layers", type=int, default=2, help="the 8B shape's target depth")
    parser.add_argument("--precompile", action="store_true", help="torch._dynamo.config.caching_precompile = True")
    parser.add_argument("--dynamic", action="store_true", help="propose compiled with dynamic=True (the iterations "
                        "are the decoder's own, static)")  # fmt: skip
    parser.add_argument("--artifacts", action="store_true", help="also compile from the cold run's saved artifacts, "
                        "in a new cache folder (torch.compiler.save_cache_artifacts / load_cache_artifacts)")  # fmt: skip
    parser.add_argument(CHILD, dest="child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--save-artifacts", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--load-artifacts", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.device, args.k, args.inductor_defaults, args.shape, args.precompile,
                               args.save_artifacts, args.load_artifacts, args.layers, args.dynamic)))  # fmt: skip
        return

    import torch

    from specdraft.demo import compile_options

    options = (
        "torch.compile defaults" if args.inductor_defaults else f"the demo's: {compile_options(args.device, True)}"
    )
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{os.cpu_count()} CPU cores, 1 torch thread"
    sizes = "demo sizes" if args.shape == "demo" else f"8B-shaped target ({args.layers} layers) and EAGLE-3 head, B = 8"
    print(f"Compile time, {sizes} (K = {args.k}); {args.device}: {where}; torch {torch.__version__}")
    precompile = ", Dynamo caching_precompile" if args.precompile else ""
    print(f"options: fullgraph=True, dynamic={args.dynamic}, {options}{precompile}; seconds; load = 1-min load "
          "average; traces: Dynamo's attempts at the frame (2: one restart)\n")  # fmt: skip
    headers = [
        "function",
        "cold s",
        "Dynamo s",
        "backend s",
        "of which kernel builds s",
        "warm s",
        "first compile of the process (cold / warm) s",
        "warm Dynamo s",
        "warm backend s",
        "load (cold / warm)",
        "traces (cold)",
    ]
    if args.artifacts:
        headers += ["from artifacts s", "artifacts MB", "artifact load s"]
    rows = []
    for what in args.what:
        with tempfile.TemporaryDirectory(prefix="specdraft-compile-") as cache:
            saved = os.path.join(cache, "artifacts.bin") if args.artifacts else None
            cold = measure(what, args, cache, save_to=saved)
            warm = measure(what, args, cache)
            if args.artifacts:
                with tempfile.TemporaryDirectory(prefix="specdraft-compile-") as fresh:
                    loaded = measure(what, args, fresh, load_from=saved)
        rows.append([what, fmt(cold, "compile_s"), fmt(cold, "dynamo_s"), fmt(cold, "backend_s"),
                     fmt(cold, "kernel_wait_s"), fmt(warm, "compile_s"),
                     f"{cold['stack_s']:.1f} / {warm['stack_s']:.1f}", fmt(warm, "dynamo_s"), fmt(warm, "backend_s"),
                     f"{cold['load']:.1f} / {warm['load']:.1f}", str(cold["traces"])])  # fmt: skip
        if args.artifacts:
            rows[-1] += [fmt(loaded, "compile_s"), f"{cold['artifact_bytes'] / 1e6:.2f}", fmt(loaded, "load_s")]
        print(f"  {what}: cold {cold['compile_s']:.1f} s, warm {warm['compile_s']:.1f} s", file=sys.stderr, flush=True)
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    label = "inductor defaults" if args.inductor_defaults else "demo"
    config = {"device_kind": args.device, "shape": args.shape,
              "options": label + (" + caching_precompile" if args.precompile else "")}  # fmt: skip
    if args.artifacts:
        config["artifacts"] = True
    if args.dynamic:
        config["dynamic"] = True  # rows without it: dynamic=False
    if args.shape == "8b":
        config["target_layers"] = args.layers  # rows without it: 2
    if os.environ.get("PYTHONPYCACHEPREFIX") and not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        config["bytecode"] = "cached"  # scripts/gpu_compile.sh bytecode; rows without it: as the machine has it
    append_table("compile", headers, rows, config_columns=1, config=config,
                 device=torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)")  # fmt: skip


if __name__ == "__main__":
    main()
