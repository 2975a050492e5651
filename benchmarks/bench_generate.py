"""Speculative decoding end to end (specdraft.generation), on a GPU.

1. The demo pair (the shipped 4 x 256 byte-level target + its EAGLE-3 head, the
   demo's Python prompts cycled to B requests): speculative vs plain decode tokens/s
   at B = 1, 8, 64 for K = 1, 3, 5, greedy and sampled (temperature 0.7), each
   iteration compiled with mode="reduce-overhead" (one CUDA graph per iteration).
2. A Llama-3-8B-shaped target (bf16, random weights: hidden 4096, 32 / 8 heads,
   intermediate 14336, vocab 128256, but only --layers decoder layers) with an
   8B-shaped EAGLE-3 head (draft vocabulary 32000): the compiled iteration's time
   against its floor, the model calls alone (the target's forward over K + 1 tokens
   per request, the draft's first pass over the same windows and its K - 1
   single-token steps, each compiled and captured alone in a CUDA graph), at
   B = 1..64; and the draft step's weight-streaming rate at B = 1 as a percentage
   of device-to-device copy bandwidth.

    python benchmarks/bench_generate.py            # both parts, under --budget-s
    python benchmarks/bench_generate.py --quick    # K = 3 only, fewer batch sizes
    python benchmarks/bench_generate.py --smoke    # CPU, tiny sizes, aot_eager: checks the script

Every configuration compiles its own graphs, so the script keeps to a time budget
(--budget-s, default 270 s): configurations are run in order of importance and the
rest are printed as skipped. Random 8B weights accept almost no drafts, which does
not change an iteration's work (its shapes are fixed); its time is the median of
calls on the same state (cudagraph_mark_step_begin before each, as generate does).
Tokens/s are decode tokens (every generated token but the prefill's first) per
second of the iterations, the host loop included (one [2, B] copy per iteration).
"""

import argparse
import sys
import time

import torch
from record import append_table
from tables import markdown_table

from specdraft.assets import load_demo_pair
from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.demo import BLOCK_SIZE, PROMPTS, encode
from specdraft.generation import SpeculativeDecoder, num_kv_blocks
from specdraft.generation.verify import window_batch
from specdraft.layout import BatchMetadata
from specdraft.models import DraftModelConfig, Eagle3Head, TinyTargetModel
from specdraft.models.regions import in_layer_regions
from specdraft.proposers import EagleProposer

TEMPERATURE = 0.7


class Budget:
    def __init__(self, seconds: float) -> None:
        self.start, self.seconds = time.perf_counter(), seconds

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def over(self) -> bool:
        return self.spent() > self.seconds


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def two_decimals(value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def table(headers, rows) -> str:
    """The generate benches' markdown table: floats to two decimals."""
    return markdown_table(headers, rows, cell=two_decimals)


class Device:
    """CUDA: mode="reduce-overhead" and CUDA-event / CUDA-graph timing; the CPU smoke
    run: aot_eager (Dynamo's fullgraph trace and AOT, no codegen) and wall clocks."""

    def __init__(self, smoke: bool) -> None:
        self.smoke = smoke
        self.name = "cpu" if smoke else "cuda"
        if not smoke and not torch.cuda.is_available():
            raise SystemExit("needs a CUDA device (or --smoke for a CPU check of the script)")
        self.iteration_compile = {"backend": "aot_eager"} if smoke else {"mode": "reduce-overhead"}

    def compile_alone(self, fn):
        backend = {"backend": "aot_eager"} if self.smoke else {}
        # Static shapes, as the decoder's own compile: the layers as regions too.
        return in_layer_regions(torch.compile(fn, fullgraph=True, dynamic=False, **backend))

    def sync(self) -> None:
        if not self.smoke:
            torch.cuda.synchronize()

    def time_us(self, fn, graph: bool = False) -> float:
        """Median µs per call: CUDA-graph replays (graph=True) or event-timed calls."""
        if self.smoke:
            fn()
            times = []
            for _ in range(3):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return sorted(times)[1] * 1e6
        from triton.testing import do_bench, do_bench_cudagraph

        fn()
        torch.cuda.synchronize()
        if graph:
            return do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
        return do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3


def kernel_profile(fn, calls: int = 5, rows: int = 30) -> str:
    """The CUDA kernels of `calls` calls of fn (CUDA-graph replays included), by total
    device time: where an iteration's time over its floor goes."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return "(no CUDA device: no kernel profile)"
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=90)


def kernel_list(fn, calls: int = 5) -> str:
    """Every CUDA kernel of one call of fn (the mean over `calls` calls): µs per call,
    launches per call and name, by time, with the totals. Two such lists (an
    iteration's and its floor pieces') say which kernels the iteration adds."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return "(no CUDA device: no kernel list)"
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", None)
        device_us = event.self_cuda_time_total if device_us is None else device_us
        if device_us > 0:
            rows.append((device_us / calls, event.count / calls, event.key[:140]))
    rows.sort(reverse=True)
    lines = [f"{us:9.1f} µs {count:6.1f}x  {name}" for us, count, name in rows]
    total_us, launches = sum(r[0] for r in rows), sum(r[1] for r in rows)
    return "\n".join(lines + [f"{total_us:9.1f} µs {launches:6.1f}x  total per call"])


def raise_recompile_limits() -> None:
    # Every decoder compiles SpeculativeDecoder.iteration (one code object) for its
    # own shapes; the default limit of 8 per code object would stop compiling.
    config = torch._dynamo.config
    for name, value in (("recompile_limit", 256), ("cache_size_limit", 256), ("accumulated_recompile_limit", 4096)):
        if hasattr(config, name):
            setattr(config, name, value)


# ------------------------------------------------------------------------ the demo pair


def demo_pair_section(dev: Device, budget: Budget, ks, batch_sizes, samplings, max_new_tokens: int) -> str:
    target, head = load_demo_pair(device=dev.name)
    max_model_len = max(len(p.encode()) for p in PROMPTS) + max_new_tokens + 1
    plain_runs = {}  # (B, sampled) -> the plain decoder's result (it does not depend on K)
    rows = []
    for sampled in samplings:
        for k in ks:
            for num_reqs in batch_sizes:
                label = [num_reqs, k, "sampled" if sampled else "greedy"]
                if rows and budget.over():
                    rows.append(label + ["skipped (time budget)"] + [""] * 4)
                    continue
                prompts = encode([PROMPTS[i % len(PROMPTS)] for i in range(num_reqs)])
                sampling = None
                if sampled:
                    sampling = SamplingParams(torch.full((num_reqs,), TEMPERATURE), torch.arange(num_reqs))
                run = {"max_new_tokens": max_new_tokens, "sampling": sampling}
                # A few iterations: compile, then CUDA-graph warm-up and recording (the
                # output width does not follow max_new_tokens, so the timed run reuses all).
                warm_up = {"max_new_tokens": min(8, max_new_tokens), "sampling": sampling}
                key = (num_reqs, sampled)
                if key not in plain_runs:
                    plain = SpeculativeDecoder(
                        target, None, max_model_len=max_model_len, block_size=BLOCK_SIZE,
                        compile=dev.iteration_compile,
                    )  # fmt: skip
                    plain.generate(prompts, **warm_up)  # compile, record the graph
                    plain_runs[key] = plain.generate(prompts, **run)
                config = SpeculativeConfig(
                    method="eagle3", num_speculative_tokens=k, max_model_len=max_model_len, block_size=BLOCK_SIZE
                )
                caches = head.allocate_kv_caches(num_kv_blocks(num_reqs, max_model_len, k, BLOCK_SIZE), BLOCK_SIZE)
                spec = SpeculativeDecoder(target, EagleProposer(head, config, caches), compile=dev.iteration_compile)
                spec.generate(prompts, **warm_up)
                got = spec.generate(prompts, **run)
                want = plain_runs[key]
                if not sampled and [t.tolist() for t in got.tokens] != [t.tolist() for t in want.tokens]:
                    log(f"note: B={num_reqs} K={k}: greedy speculative output differs from plain decoding")
                plain_tps, spec_tps = want.stats.decode_tokens_per_s.item(), got.stats.decode_tokens_per_s.item()
                rows.append(label + [
                    plain_tps, spec_tps, spec_tps / plain_tps, got.stats.mean_acceptance_length.item(),
                    int(got.stats.num_verify_passes),
                ])  # fmt: skip
                log(f"demo pair B={num_reqs} K={k} {label[2]}: plain {plain_tps:.0f} tok/s, speculative "
                    f"{spec_tps:.0f} tok/s ({budget.spent():.0f} s)")  # fmt: skip
    headers = ["B", "K", "sampling", "plain tok/s", "speculative tok/s", "speedup", "acceptance length", "passes"]
    if not dev.smoke:
        append_table("generate", headers, [r for r in rows if not isinstance(r[3], str)], config_columns=3,
                     config={"pair": "demo", "max_new_tokens": max_new_tokens})  # fmt: skip
    return (
        f"Demo pair (4 x 256 target + EAGLE-3 head, fp32), {max_new_tokens} new tokens per request, "
        f"max_model_len {max_model_len}; decode tokens/s\n\n" + table(headers, rows)
    )


# -------------------------------------------------------------------- 8B-shaped models


def llama8b_shapes(smoke: bool) -> dict:
    if smoke:
        return dict(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, vocab_size=512)
    return dict(hidden_size=4096, intermediate_size=14336, num_heads=32, num_kv_heads=8, vocab_size=128256)


def build_8b(dev: Device, num_layers: int, draft_vocab: int):
    shapes = llama8b_shapes(dev.smoke)
    dtype = torch.float32 if dev.smoke else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(dev.name):
        target = TinyTargetModel(DraftModelConfig(**shapes, num_layers=num_layers, rope_theta=500000.0, dtype=dtype))
        head = Eagle3Head(
            DraftModelConfig(**shapes, draft_vocab_size=draft_vocab, target_hidden_size=shapes["hidden_size"],
                             rope_theta=500000.0, dtype=dtype)
        )  # fmt: skip
    for module in (target, head):
        module.eval()
        for p in module.parameters():
            torch.nn.init.normal_(p, std=0.02)
    vocab = shapes["vocab_size"]
    targets = torch.randperm(vocab, device=dev.name)[:draft_vocab].sort().values
    head.d2t.copy_(targets - torch.arange(draft_vocab, device=dev.name))
    head.t2d.zero_()[targets] = True
    head.share_from(target)
    return target, head


def step_weight_bytes(head: Eagle3Head) -> int:
    """What one single-token draft step streams: the midlayer, the final norm and the
    lm_head (the embedding reads one row per token; fc runs in the first pass only)."""
    modules = (head.midlayer, head.norm, head.lm_head)
    return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())


def floor_fns(dev: Device, decoder: SpeculativeDecoder, state, requests, rows_per_request: int | None = None,
              compile: bool = True):  # fmt: skip
    """The model calls of one iteration alone, each compiled (compile=False: eager):
    (target forward over K + 1 tokens per request, or rows_per_request (at most
    K + 1), with its logits, the draft's first pass with its logits at each
    request's last row, one single-token draft step with logits)."""
    k, target, proposer = decoder.k, decoder.target, decoder.proposer
    head, caches = proposer.model, proposer.kv_caches
    num_reqs = state.lens.shape[0]
    width = k + 1 if rows_per_request is None else rows_per_request
    token_ids = torch.cat([state.last_tokens[:, None], state.drafts], dim=1)[:, :width].reshape(-1)
    positions, metadata = window_batch(state.lens, width, requests.block_table, decoder.block_size, decoder.reach)
    rows = metadata.query_start_loc[1:].long() - 1

    def target_forward():
        hidden, aux = decoder.run_target(token_ids, positions, metadata)
        return target.compute_logits(hidden), aux

    _, aux = target_forward()
    aux = aux.clone()

    def first_pass():
        h_sample, h_next = head(token_ids, positions, aux, metadata, caches)
        return head.compute_logits(h_sample.index_select(0, rows)), h_next.index_select(0, rows)

    step_positions = positions.index_select(0, rows) + 1
    step_slots = decoder.block_size * requests.block_table.long().gather(
        1, (step_positions // decoder.block_size)[:, None]
    )[:, 0] + step_positions % decoder.block_size  # fmt: skip
    step_metadata = BatchMetadata(
        query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32, device=token_ids.device),
        seq_lens=(step_positions + 1).to(torch.int32),
        block_table=requests.block_table,
        slot_mapping=step_slots,
        max_query_len=1,
        max_seq_len=decoder.reach,
    )
    step_ids = state.last_tokens.clone()
    step_hidden = torch.zeros(num_reqs, head.config.hidden_size, dtype=aux.dtype, device=aux.device)

    def draft_step():
        h_sample, h_next = head(step_ids, step_positions, step_hidden, step_metadata, caches, spec_step_idx=1)
        return head.compute_logits(h_sample).argmax(-1), h_next

    fns = (target_forward, first_pass, draft_step)
    return [dev.compile_alone(fn) for fn in fns] if compile else list(fns)


def warmed_iteration(dev: Device, decoder, state, requests):
    """The decoder's compiled iteration over (state, requests) as a no-argument
    function, called three times first: compile, warm up, record the CUDA graph."""

    def iteration():
        if not dev.smoke:
            torch.compiler.cudagraph_mark_step_begin()
        return decoder.compiled["iteration"](state, requests)

    for _ in range(3):
        iteration()
    return iteration


def llama8b_section(dev: Device, budget: Budget, k: int, batch_sizes, num_layers: int, max_model_len: int) -> str:
    draft_vocab = 256 if dev.smoke else 32000
    target, head = build_8b(dev, num_layers, draft_vocab)
    vocab = target.config.vocab_size
    rows, stream = [], None
    for num_reqs in batch_sizes:
        if rows and budget.over():
            rows.append([num_reqs, "skipped (time budget)"] + [""] * 5)
            continue
        config = SpeculativeConfig(
            method="eagle3", num_speculative_tokens=k, max_model_len=max_model_len, block_size=BLOCK_SIZE
        )
        caches = head.allocate_kv_caches(num_kv_blocks(num_reqs, max_model_len, k, BLOCK_SIZE), BLOCK_SIZE)
        decoder = SpeculativeDecoder(target, EagleProposer(head, config, caches), compile=dev.iteration_compile)
        gen = torch.Generator().manual_seed(num_reqs)
        prompts = [torch.randint(0, vocab, (32,), generator=gen).tolist() for _ in range(num_reqs)]
        prompts, requests = decoder.requests(prompts, 64, None, None)
        with torch.no_grad():
            state = decoder.prefill(prompts, requests)

            iteration_us = dev.time_us(warmed_iteration(dev, decoder, state, requests))
            target_fn, first_fn, step_fn = floor_fns(dev, decoder, state, requests)
            target_us = dev.time_us(target_fn, graph=True)
            first_us = dev.time_us(first_fn, graph=True)
            step_us = dev.time_us(step_fn, graph=True)
        floor = target_us + first_us + (k - 1) * step_us
        rows.append([num_reqs, iteration_us, floor, iteration_us / floor, target_us, first_us, step_us])
        if num_reqs == 1:
            stream = step_us
        log(f"8B-shaped B={num_reqs}: iteration {iteration_us:.0f} µs, floor {floor:.0f} µs ({budget.spent():.0f} s)")
    headers = ["B", "iteration µs", "floor µs", "iteration / floor", "target fwd µs", "draft first pass µs",
               "draft step µs"]  # fmt: skip
    if not dev.smoke:
        append_table("generate_8b", headers, [r for r in rows if not isinstance(r[1], str)], config_columns=1,
                     config={"target": f"8B-shaped, {num_layers} of 32 layers", "K": k})  # fmt: skip
    text = (
        f"Llama-3-8B-shaped target with {num_layers} decoder layers (of 32; {target.config.dtype}, random weights, hidden "
        f"{target.config.hidden_size}, {target.config.num_heads}/{target.config.num_kv_heads} heads, intermediate "
        f"{target.config.intermediate_size}, vocab {vocab}) + 8B-shaped EAGLE-3 head (draft vocab {draft_vocab}); "
        f"K = {k}, max_model_len {max_model_len} (attention reads the block table's reach, {decoder.reach} "
        f"positions); floor = target fwd + draft first pass + {k - 1} x draft step, each captured alone\n\n"
        + table(headers, rows)
    )
    if stream is not None:
        nbytes = step_weight_bytes(head)
        rate = nbytes / (stream * 1e-6) / 1e9
        if dev.smoke:
            text += f"\n\nDraft step at B = 1: {nbytes / 1e6:.1f} MB of weights in {stream:.0f} µs = {rate:.1f} GB/s"
        else:
            from harness import copy_bandwidth_gbs

            copy = copy_bandwidth_gbs()
            text += (
                f"\n\nDraft step at B = 1: {nbytes / 1e6:.0f} MB of weights in {stream:.1f} µs = {rate:.0f} GB/s, "
                f"{100 * rate / copy:.1f}% of device-to-device copy bandwidth ({copy:.0f} GB/s, read + write)"
            )
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="K = 3, B = 1 and 64, greedy + sampled; 8B at B = 1, 64")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, aot_eager: a check of the script")
    parser.add_argument("--budget-s", type=float, default=270.0, help="stop starting configurations after this")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the 8B-shaped target (default 2)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="demo pair, per request")
    parser.add_argument("--skip", choices=["demo", "8b"], default=None)
    parser.add_argument("--ks", type=int, nargs="+", help="demo pair: these K only (sampled runs too)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="demo pair: these B only")
    parser.add_argument("--big-batch-sizes", type=int, nargs="+", help="8B-shaped: these B only")
    parser.add_argument("--sampling", choices=["greedy", "sampled", "both"], default="both", help="demo pair")
    args = parser.parse_args(argv)
    dev = Device(args.smoke)
    raise_recompile_limits()
    budget = Budget(args.budget_s)  # the 8B section's: the whole run
    demo_budget = Budget(args.budget_s * (0.5 if args.skip is None else 1.0))
    if args.smoke:
        torch.set_num_threads(1)
        ks, batch_sizes, new_tokens = [1, 2], [1, 2], 8
        big_batch_sizes, max_model_len = [1, 2], 64
    elif args.quick:
        ks, batch_sizes, new_tokens = [3], [1, 64], args.max_new_tokens
        big_batch_sizes, max_model_len = [1, 64], 1024
    else:
        ks, batch_sizes, new_tokens = [3, 1, 5], [1, 64, 8], args.max_new_tokens
        big_batch_sizes, max_model_len = [1, 64, 8, 32], 1024
    sampled_ks = ks if args.smoke else [3]  # each (K, sampling) pair is a compile
    if args.ks:
        ks = sampled_ks = args.ks
    batch_sizes = args.batch_sizes or batch_sizes
    big_batch_sizes = args.big_batch_sizes or big_batch_sizes
    where = "CPU (smoke run)" if args.smoke else torch.cuda.get_device_name()
    print(f"Device: {where}; torch {torch.__version__}\n")
    if args.skip != "demo":
        if args.sampling != "sampled":
            section = demo_pair_section(dev, demo_budget, ks, batch_sizes, [False], new_tokens)
            print(section + "\n", flush=True)
        if args.sampling != "greedy":
            section = demo_pair_section(dev, demo_budget, sampled_ks, batch_sizes, [True], new_tokens)
            print(section + "\n", flush=True)
    if args.skip != "8b":
        section = llama8b_section(dev, budget, 3 if not args.smoke else 2, big_batch_sizes, args.layers, max_model_len)
        print(section + "\n", flush=True)
    print(f"total {budget.spent():.0f} s (budget {args.budget_s:.0f} s: half for the demo pair, the rest for 8B)")


if __name__ == "__main__":
    main()
