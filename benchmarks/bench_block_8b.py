"""Block drafters (DSpark, DFlash) on a Llama-3-8B-shaped target, B = 1 (and 8):
what one block propose and one speculative iteration cost against their floors, and
the speedup the demo pair's acceptance length projects.

The target is bench_generate's 8B shape with all 32 decoder layers (bf16, random
weights, hidden 4096, 32 / 8 heads, intermediate 14336, vocab 128256: 16 GB). The
drafter is Qwen3-8B-shaped, as DeepSpec's released DSpark head for Qwen3-8B: 5
decoder layers, hidden 4096, 32 / 8 heads, head_dim 128, intermediate 12288, qk_norm,
block_size 7, reading 5 of the target's layers (fc over 5 x 4096); DSpark adds the
vanilla Markov head of rank 256 and the confidence head with the Markov embedding;
DFlash is the same backbone without either. It shares the target's embedding and
lm_head, as DeepSpec's heads do, so its vocabulary is the target's, 128256 (not
Qwen3's 151936: the Markov head's two [V, 256] tables and the lm_head are that much
smaller than Qwen3-8B's). K = block_size = 7 drafts are verified per pass.

Three tables:

1. block propose against its floor: the decoder's draft half, compiled
   (fullgraph, mode="reduce-overhead"; BlockProposer.propose_padded over the verified
   windows: context write, one forward over the block, sampling, the confidence
   logits), against the draft forward alone (the context's keys and values of the
   verified window written to the paged cache, the 5 layers over the block, lm_head)
   + the sampling alone (DSpark: the fused Markov op `ops.markov_block_sample`;
   DFlash: the block's argmax), each compiled and captured alone. Target: <= 1.10.
2. iteration against floor: the whole compiled iteration (verify, accept, commit,
   propose: one CUDA graph) against the target's forward over K + 1 tokens + the
   propose floor, each captured alone.
3. projected 8B speedup = the demo pair's acceptance length (greedy, B = 1, K = 7:
   the `block_pair` table of benchmarks/results, written by bench_block_pair.py, or
   --acceptance dspark=AL dflash=AL) x plain iteration time / speculative iteration
   time; "n/a" where no acceptance length is known.

Every time is the median of --rounds interleaved rounds (the iteration and its floor
pieces timed one after another in each round, so a drift of the GPU's clock moves
them alike), with the per-round ratios' range. Each configuration's kernels (the
propose's and its floor pieces'; with --profile the iteration's too) are logged to
stderr (bench_generate.kernel_list).

    python3 benchmarks/bench_block_8b.py                  # GPU: B = 1, DSpark then DFlash
    python3 benchmarks/bench_block_8b.py --batch-sizes 1 8 --budget-s 400
    python3 benchmarks/bench_block_8b.py --smoke          # CPU, tiny sizes, aot_eager: a check of the script

Configurations run in order of importance (per B: DSpark, plain decoding, DFlash)
under --budget-s (default 240 s; a 32-layer target compiles in about a minute, and
each B compiles it three times: plain, speculative iteration, floor); the rest are
printed as skipped. Rows go to the `block_8b` table (benchmarks/record.py; not with
--smoke). DSpark needs `specdraft.ops.markov_block_sample`; without it its rows are
skipped.
"""

import argparse
import pathlib
from statistics import median

import torch
from bench_generate import (
    BLOCK_SIZE,
    Budget,
    Device,
    kernel_list,
    llama8b_shapes,
    log,
    raise_recompile_limits,
    table,
    warmed_iteration,
)
from bench_tree_8b import interleaved_us
from record import RESULTS, append_rows, read_rows, table_path

import specdraft.ops
from specdraft.config import SpeculativeConfig
from specdraft.generation import SpeculativeDecoder, num_kv_blocks
from specdraft.generation.verify import window_batch
from specdraft.models import BlockConfig, BlockDraftHead, DraftModelConfig, TinyTargetModel
from specdraft.models.kv_cache import write_kv_cache
from specdraft.proposers import BlockProposer
from specdraft.proposers.block import block_forward

KINDS = ("dspark", "dflash")
BLOCK = 7  # block_size = K
MAX_MODEL_LEN = 1024
PROMPT_LEN = 128
ACCEPTANCE_TABLE = "block_pair"


def has_markov_op() -> bool:
    return hasattr(specdraft.ops, "markov_block_sample")


# ----------------------------------------------------------------------------- models


def build_target(dev: Device, num_layers: int) -> TinyTargetModel:
    """bench_generate.build_8b's target alone (its shapes, seed and init), without the
    EAGLE-3 head build_8b makes too."""
    shapes = llama8b_shapes(dev.smoke)
    dtype = torch.float32 if dev.smoke else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(dev.name):
        target = TinyTargetModel(DraftModelConfig(**shapes, num_layers=num_layers, rope_theta=500000.0, dtype=dtype))
    target.eval()
    for p in target.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return target


def target_layer_ids(num_layers: int) -> tuple[int, ...]:
    """5 target layers spread as DeepSpec's Qwen3-8B head reads its 36 ([1, 9, 17, 25,
    33]: from layer 1 to the third from last); a target too shallow for 5 gives every
    layer it can (-1, the embeddings, up to its last but one)."""
    if num_layers >= 8:
        last = num_layers - 3
        return tuple(round(1 + i * (last - 1) / 4) for i in range(5))
    return tuple(range(-1, num_layers - 1))[-5:]


def build_head(dev: Device, target: TinyTargetModel, kind: str) -> BlockDraftHead:
    """The Qwen3-8B-shaped DSpark (or DFlash) head over `target`, random weights,
    sharing its embedding and lm_head."""
    t = target.config
    shapes = dict(intermediate_size=96, num_heads=4, num_kv_heads=2, head_dim=16) if dev.smoke else dict(
        intermediate_size=12288, num_heads=32, num_kv_heads=8, head_dim=128
    )  # fmt: skip
    config = DraftModelConfig(
        hidden_size=t.hidden_size, vocab_size=t.vocab_size, target_hidden_size=t.hidden_size, num_layers=5,
        qk_norm=True, rope_theta=1e6, rms_norm_eps=1e-6, dtype=t.dtype, **shapes,
    )  # fmt: skip
    rank = 16 if dev.smoke else 256
    dspark = kind == "dspark"
    block = BlockConfig(
        block_size=BLOCK, mask_token_id=t.vocab_size - 1, target_layer_ids=target_layer_ids(t.num_layers),
        num_target_layers=t.num_layers, markov_rank=rank if dspark else 0,
        markov_head_type="vanilla" if dspark else None, confidence_head=dspark, confidence_with_markov=dspark,
    )  # fmt: skip
    torch.manual_seed(1)
    with torch.device(dev.name):
        head = BlockDraftHead(config, block)
    head.eval()
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.02)
    head.share_from(target)
    return head


def describe_head(head: BlockDraftHead) -> str:
    c, b = head.config, head.block
    markov = f"Markov {b.markov_head_type} rank {b.markov_rank}" if b.markov_rank else "no Markov head"
    confidence = "confidence head" + (" with Markov" if b.confidence_with_markov else "") if b.confidence_head else ""
    return (f"{b.kind}: {c.num_layers} layers, hidden {c.hidden_size}, {c.num_heads}/{c.num_kv_heads} heads, head_dim "
            f"{c.head_dim}, intermediate {c.intermediate_size}, qk_norm, block {b.block_size}, target layers "
            f"{list(b.target_layer_ids)}, {markov}" + (f", {confidence}" if confidence else "") + f", vocab "
            f"{c.vocab_size} (the target's), {c.dtype}")  # fmt: skip


# --------------------------------------------------------------------------- decoders


def plain_decoder(dev: Device, target, caches) -> SpeculativeDecoder:
    return SpeculativeDecoder(target, None, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
                              compile=dev.iteration_compile, target_kv_caches=caches)  # fmt: skip


def block_decoder(dev: Device, target, head, num_reqs: int, caches) -> SpeculativeDecoder:
    config = SpeculativeConfig(method="block", num_speculative_tokens=BLOCK, max_model_len=MAX_MODEL_LEN,
                               block_size=BLOCK_SIZE)  # fmt: skip
    draft_caches = head.allocate_kv_caches(num_kv_blocks(num_reqs, MAX_MODEL_LEN, BLOCK, BLOCK_SIZE), BLOCK_SIZE)
    proposer = BlockProposer(head, config, draft_caches)
    return SpeculativeDecoder(target, proposer, compile=dev.iteration_compile, target_kv_caches=caches)


def prefilled(decoder: SpeculativeDecoder, num_reqs: int):
    """(state, requests) after the prefill of num_reqs random PROMPT_LEN-token prompts
    (the same prompts for every decoder of a batch size)."""
    gen = torch.Generator().manual_seed(num_reqs)
    vocab = decoder.target.config.vocab_size
    prompts = [torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist() for _ in range(num_reqs)]
    prompts, requests = decoder.requests(prompts, MAX_MODEL_LEN - PROMPT_LEN, None, None)
    return decoder.prefill(prompts, requests), requests


def graph_call(dev: Device, fn):
    """fn as the decoder calls a mode="reduce-overhead" function: a new CUDA-graph
    step first; called three times (compile, warm-up, recording)."""

    def call():
        if not dev.smoke:
            torch.compiler.cudagraph_mark_step_begin()
        return fn()

    for _ in range(3):
        call()
    return call


# ----------------------------------------------------------------------------- floors


def target_floor_fn(dev: Device, decoder: SpeculativeDecoder, state, requests):
    """The target's forward with its logits over [last token, K drafts] of every
    request (the verify pass without the acceptance and the commit), compiled alone."""
    token_ids = torch.cat([state.last_tokens[:, None], state.drafts], dim=1).reshape(-1)
    positions, metadata = window_batch(state.lens, decoder.k + 1, requests.block_table, decoder.block_size,
                                       decoder.reach)  # fmt: skip

    def target_forward():
        hidden, aux = decoder.run_target(token_ids, positions, metadata)
        return decoder.target.compute_logits(hidden), aux

    return dev.compile_alone(target_forward)


def propose_floor_fns(dev: Device, decoder: SpeculativeDecoder, after, verified, requests):
    """(draft forward, sampling), each compiled alone: the draft forward writes the
    verified window's context keys and values to the draft's paged cache, runs the
    layers over each request's block (at its accepted length) and the lm_head; the
    sampling is DSpark's fused Markov op over the block's logits, or DFlash's argmax
    over the first K rows."""
    head, caches, k = decoder.proposer.model, decoder.proposer.kv_caches, decoder.k
    _, metadata = window_batch(verified.lens, k + 1, requests.block_table, decoder.block_size, decoder.reach)
    context_lens = after.lens.to(metadata.seq_lens.dtype)
    newest = after.last_tokens

    def draft_forward():
        context = head.project_context(verified.hidden_states)
        for i, cache in enumerate(caches):
            key, value = head.context_kv(i, verified.positions, context)
            write_kv_cache(cache, key, value, metadata.slot_mapping)
        hidden = block_forward(head, caches, newest, context_lens, metadata)
        return head.compute_logits(hidden)

    with torch.no_grad():
        logits = draft_forward().clone()
    if head.markov_head is None:

        def sample():
            return logits[:, :k].argmax(dim=-1)

    else:
        markov, num_reqs = head.markov_head, logits.shape[0]
        temperature = torch.zeros(num_reqs, dtype=torch.float32, device=logits.device)
        seeds = torch.zeros(num_reqs, dtype=torch.int64, device=logits.device)
        positions = after.lens + 1

        def sample():
            return specdraft.ops.markov_block_sample(
                logits, newest, markov.markov_w1.weight, markov.markov_w2.weight, kind=markov.kind,
                temperature=temperature, seeds=seeds, positions=positions,
            )  # fmt: skip

    return dev.compile_alone(draft_forward), dev.compile_alone(sample)


# ------------------------------------------------------------------------ measurement


def measure_plain(dev: Device, target, caches, num_reqs: int, rounds: int) -> float:
    decoder = plain_decoder(dev, target, caches)
    with torch.no_grad():
        state, requests = prefilled(decoder, num_reqs)
        fn = warmed_iteration(dev, decoder, state, requests)
        return median(interleaved_us(dev, {"plain": (fn, False)}, rounds)["plain"])


def measure_block(dev: Device, target, head, caches, num_reqs: int, rounds: int, shared: dict, profile: bool) -> dict:
    """One configuration's times (µs, medians over rounds) and per-round ratios.
    shared: the batch size's compiled target floor, built by its first configuration
    and reused by the next (the same target, batch and K)."""
    decoder = block_decoder(dev, target, head, num_reqs, caches)
    with torch.no_grad():
        state, requests = prefilled(decoder, num_reqs)
        iteration = warmed_iteration(dev, decoder, state, requests)
        after, verified = decoder.verify(state, requests)  # eager: the draft half's inputs
        propose = graph_call(dev, lambda: decoder.compiled["draft"](after, verified, requests))
        if "target" not in shared:
            shared["target"] = target_floor_fn(dev, decoder, state, requests)
        draft_fn, sample_fn = propose_floor_fns(dev, decoder, after, verified, requests)
        if not dev.smoke:
            pieces = [("propose (compiled, reduce-overhead)", propose), ("floor: draft forward", draft_fn),
                      ("floor: sampling", sample_fn)]  # fmt: skip
            if profile:
                pieces = [("iteration", iteration), ("floor: target forward", shared["target"]), *pieces]
            for name, fn in pieces:
                log(f"kernels of the {head.block.kind} {name}, B = {num_reqs}:\n" + kernel_list(fn))
        fns = {"iteration": (iteration, False), "propose": (propose, False), "target": (shared["target"], True),
               "draft": (draft_fn, True), "sample": (sample_fn, True)}  # fmt: skip
        times = interleaved_us(dev, fns, rounds)
    propose_floors = [d + s for d, s in zip(times["draft"], times["sample"], strict=True)]
    floors = [t + p for t, p in zip(times["target"], propose_floors, strict=True)]
    propose_ratios = [p / f for p, f in zip(times["propose"], propose_floors, strict=True)]
    ratios = [i / f for i, f in zip(times["iteration"], floors, strict=True)]
    out = {f"{name}_us": median(values) for name, values in times.items()}
    out.update(propose_floor_us=median(propose_floors), propose_ratio=median(propose_ratios),
               propose_ratio_range=spread(propose_ratios), floor_us=median(floors), ratio=median(ratios),
               ratio_range=spread(ratios))  # fmt: skip
    return out


def spread(values) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def load_acceptance(path: pathlib.Path, overrides) -> dict[str, tuple[float, str]]:
    """kind -> (the demo pair's acceptance length, where it came from): the newest
    greedy B = 1, K = 7 row of each drafter in the `block_pair` table (trained heads
    only), then --acceptance KIND=AL."""
    lengths = {}
    if path.is_file():
        for row in read_rows(path.stem, path.parent):
            c = row["config"]
            greedy_k7 = c.get("B") == 1 and c.get("temperature") == 0 and c.get("K") == BLOCK and c.get("topk") == 1
            if greedy_k7 and c.get("weights") != "random":
                lengths[c["drafter"]] = (row["metrics"]["acceptance_length"], f"{path.name} ({row['device']})")
    for text in overrides or []:
        kind, _, value = text.partition("=")
        lengths[kind] = (float(value), "--acceptance")
    return lengths


def parse_acceptance(parser: argparse.ArgumentParser, texts) -> None:
    for text in texts or []:
        kind, sep, value = text.partition("=")
        try:
            ok = sep and kind in (*KINDS, "eagle3") and float(value) >= 1
        except ValueError:
            ok = False
        if not ok:
            parser.error(f"--acceptance: {text!r} is not KIND=AL (KIND one of {', '.join(KINDS)}; AL >= 1)")


# ---------------------------------------------------------------------------- report


HEADERS = ["drafter", "B", "K", "propose µs", "propose floor µs", "propose / floor", "propose range",
           "draft forward µs", "sampling µs", "iteration µs", "floor µs", "iteration / floor", "iteration range",
           "target fwd µs", "plain iteration µs", "acceptance length (demo pair)", "projected speedup"]  # fmt: skip


def report_rows(results: list[dict], plain: dict, acceptance: dict) -> list[list]:
    rows = []
    for r in results:
        label = [r["drafter"], r["B"], BLOCK]
        if "skipped" in r:
            rows.append(label + [r["skipped"]] + [""] * (len(HEADERS) - 4))
            continue
        plain_us = plain.get(r["B"])
        length, source = acceptance.get(r["drafter"], (None, None))
        projected = length * plain_us / r["iteration_us"] if length is not None and plain_us is not None else None
        r.update(plain_iteration_us=plain_us, acceptance_length=length, acceptance_source=source,
                 projected_speedup=projected)  # fmt: skip
        na = "n/a"
        rows.append(label + [
            r["propose_us"], r["propose_floor_us"], f"{r['propose_ratio']:.3f}", r["propose_ratio_range"],
            r["draft_us"], r["sample_us"], r["iteration_us"], r["floor_us"], f"{r['ratio']:.3f}", r["ratio_range"],
            r["target_us"], na if plain_us is None else plain_us, na if length is None else length,
            na if projected is None else f"{projected:.3f}",
        ])  # fmt: skip
    return rows


def record(results: list[dict], device: str, layers: int, profile: bool) -> None:
    keep = [r for r in results if "skipped" not in r]
    append_rows(
        "block_8b",
        [({"drafter": r["drafter"], "B": r["B"], "K": BLOCK, "block_size": BLOCK, "layers": layers,
           "profile": profile}, {k: v for k, v in r.items() if k not in ("drafter", "B", "head")}) for r in keep],
        device=device,
    )  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, aot_eager: a check of the script")
    parser.add_argument("--layers", type=int, default=32, help="target decoder layers (default 32)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1], help="default: 1")
    parser.add_argument("--drafters", nargs="+", choices=KINDS, default=list(KINDS), help="in this order")
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop starting configurations after this")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (medians reported)")
    parser.add_argument("--acceptance", nargs="+", metavar="KIND=AL",
                        help="the demo pair's acceptance length of a drafter (default: the block_pair table)")  # fmt: skip
    parser.add_argument("--acceptance-table", default=str(table_path(ACCEPTANCE_TABLE, RESULTS)))
    parser.add_argument("--profile", action="store_true", help="also log each iteration's and target floor's kernels")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    parse_acceptance(parser, args.acceptance)
    dev, budget = Device(args.smoke), Budget(args.budget_s)
    raise_recompile_limits()  # decoders of several batch sizes and drafters compile the same iteration code
    if args.smoke:
        torch.set_num_threads(1)
    layers = 4 if args.smoke else args.layers
    acceptance = load_acceptance(pathlib.Path(args.acceptance_table), args.acceptance)
    target = build_target(dev, layers)
    heads = {kind: build_head(dev, target, kind) for kind in args.drafters}
    name = "CPU" if args.smoke else torch.cuda.get_device_name()
    c = target.config
    print(f"{name}, torch {torch.__version__}; target: {layers} layers, hidden {c.hidden_size}, {c.num_heads}/"
          f"{c.num_kv_heads} heads, intermediate {c.intermediate_size}, vocab {c.vocab_size}, {c.dtype}; prompt "
          f"{PROMPT_LEN}, max_model_len {MAX_MODEL_LEN}")  # fmt: skip
    for head in heads.values():
        print(f"drafter {describe_head(head)}")
    print()
    results, plain, notes = [], {}, []
    for num_reqs in args.batch_sizes:
        caches = target.allocate_kv_caches(num_kv_blocks(num_reqs, MAX_MODEL_LEN, BLOCK, BLOCK_SIZE), BLOCK_SIZE)
        shared = {}
        order = [args.drafters[0], "plain", *args.drafters[1:]]
        for kind in order:
            if budget.over():
                if kind != "plain":
                    results.append({"drafter": kind, "B": num_reqs, "skipped": "skipped (budget)"})
                continue
            if kind == "plain":
                plain[num_reqs] = measure_plain(dev, target, caches, num_reqs, args.rounds)
                log(f"plain B={num_reqs}: {plain[num_reqs]:.0f} µs per iteration ({budget.spent():.0f} s)")
                continue
            if kind == "dspark" and not has_markov_op():
                results.append({"drafter": kind, "B": num_reqs, "skipped": "needs ops.markov_block_sample"})
                continue
            out = measure_block(dev, target, heads[kind], caches, num_reqs, args.rounds, shared, args.profile)
            results.append({"drafter": kind, "B": num_reqs, **out})
            log(f"{kind} B={num_reqs}: propose {out['propose_us']:.0f} µs / floor {out['propose_floor_us']:.0f} µs "
                f"({out['propose_ratio_range']}); iteration {out['iteration_us']:.0f} µs / floor {out['floor_us']:.0f}"
                f" µs ({out['ratio_range']}) ({budget.spent():.0f} s)")  # fmt: skip
        del caches, shared
    for kind in args.drafters:
        if kind not in acceptance:
            notes.append(f"no demo-pair acceptance length for {kind}: run benchmarks/bench_block_pair.py (greedy, "
                         f"B = 1, K = {BLOCK}, trained heads) or pass --acceptance {kind}=AL")  # fmt: skip
    rows = report_rows(results, plain, acceptance)
    print(
        f"Medians of {args.rounds} rounds; propose floor = draft forward + sampling (each captured alone); "
        "iteration floor = target fwd + propose floor\n"
    )
    print(table(HEADERS, rows))
    for kind, (length, source) in acceptance.items():
        if kind in args.drafters:
            print(f"\n{kind} acceptance length {length} from {source}")
    for note in notes:
        print(f"\nnote: {note}")
    if not args.smoke:
        record(results, name, layers, args.profile)
    print(f"\ntotal {budget.spent():.0f} s (budget {args.budget_s:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
