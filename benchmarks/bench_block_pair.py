"""The drafter trio on the demo pair: EAGLE-3 (chain and tree), DFlash and DSpark
against plain decoding of the shipped 4 x 256 byte-level target: acceptance length
(tokens per request pass, bonus included: DeepSpec's "accepted prefix of the block
+ 1") and decode speedup, at B = 1 and 8, greedy and T = 0.7.

Drafters (--configs, each "NAME,K" or "eagle3,D,TOPK,N"):
- eagle3,K: the shipped EAGLE-3 head, a chain of K drafts (K + 1 tokens verified per pass);
- eagle3,D,TOPK,N: its EAGLE-2 tree (N tokens verified per pass; (7, 4, 32) is the
  `tree` table's best at depth 7);
- dflash,K / dspark,K: a block drafter, one forward over its block, the first K of
  its block_size drafts verified (K + 1 tokens per pass). The heads are the
  package's (specdraft/assets/demo_pair/dflash, .../dspark, loaded with
  specdraft.models.load_block_drafter), or --dflash DIR / --dspark DIR; until both
  the heads and the loader exist the script falls back to randomly initialised heads
  (a loud note; their rows say nothing about the drafters and are never recorded).
  DSpark needs specdraft.ops.markov_block_sample; without it its rows are skipped.

"Equal tokens per verify": every row reports the tokens it verifies per pass beside
its acceptance length, and each block drafter's acceptance length is divided by the
EAGLE-3 chain's at the same K in the same run (issue 38's target for DSpark: >= 1.15
at K = 7, the block size of DeepSpec's heads).

Requests: at B = 1 each of the demo's prompts is decoded alone; at B > 1 the prompts
are cycled to fill batches of B (ceil(prompts / B) batches). Sampled: request r (the
r-th prompt of the cycle) is seeded 1000 + r, the same seeds for plain decoding and
every drafter (one seeded run, a sample, not a mean over seeds; the drafts stay
greedy, as the demo's are). Greedy rows check their output against plain decoding
(lossless: yes / FAIL); sampled rows read n/a. Decode tokens/s: every generated token
but the prefill's first, over the iterations' time (bench_tree.decode_all's count),
the median of --repeats timed passes over every batch after one warm-up call per
configuration (compile, CUDA-graph warm-up and recording).

    python3 benchmarks/bench_block_pair.py                        # CUDA, greedy and T = 0.7, B = 1 and 8
    python3 benchmarks/bench_block_pair.py --device cpu           # CPU (Inductor, the demo's options)
    python3 benchmarks/bench_block_pair.py --sampling greedy --batch-sizes 1
    python3 benchmarks/bench_block_pair.py --smoke                # CPU, aot_eager, short: checks the script

Every (sampling, B, drafter) compiles its own iteration, so rows run in order
(sampling, then B, then --configs) under --budget-s (default 480 s); the rest are
printed as skipped. Rows go to the `block_pair` table (benchmarks/record.py; not
with --smoke, never for random heads).
"""

import argparse
import dataclasses
import inspect
import sys
import time

import torch
from record import append_rows

import specdraft.ops
from specdraft.assets import DEMO_PAIR, load_demo_pair
from specdraft.config import SamplingParams, SpeculativeConfig
from specdraft.demo import BLOCK_SIZE, PROMPTS, TEMPERATURE, compile_options, encode
from specdraft.generation import SpeculativeDecoder, TreeSpeculativeDecoder, num_kv_blocks
from specdraft.models import BlockConfig, BlockDraftHead
from specdraft.proposers import BlockProposer, EagleProposer, TreeShape

BLOCK_KINDS = ("dflash", "dspark")
CONFIGS = ["eagle3,7", "eagle3,7,4,32", "dflash,7", "dspark,7"]
SMOKE_CONFIGS = ["eagle3,3", "eagle3,3,2,6", "dflash,3", "dspark,3"]
RANDOM_BLOCK_SIZE = 7  # the random stand-in heads' block, DeepSpec's
SEED_BASE = 1000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Drafter:
    name: str  # "eagle3", "dflash", "dspark"
    k: int  # drafts per pass (a tree's depth)
    tree: TreeShape | None = None

    @property
    def topk(self) -> int:
        return 1 if self.tree is None else self.tree.topk

    @property
    def verified(self) -> int:
        """Tokens the target verifies per pass."""
        return self.k + 1 if self.tree is None else self.tree.num_verify_tokens

    @property
    def label(self) -> str:
        if self.tree is not None:
            return f"eagle3 tree ({self.k}, {self.tree.topk}, {self.tree.num_verify_tokens})"
        return f"{self.name} {'chain' if self.name == 'eagle3' else 'block'} K = {self.k}"


def parse_drafter(parser: argparse.ArgumentParser, text: str) -> Drafter:
    name, *numbers = text.split(",")
    try:
        values = [int(x) for x in numbers]
    except ValueError:
        values = []
    if name == "eagle3" and len(values) == 3:
        depth, topk, n = values
        if topk == 1 and n == depth + 1:
            return Drafter("eagle3", depth)
        return Drafter("eagle3", depth, TreeShape(depth, topk, n))
    if name in ("eagle3", *BLOCK_KINDS) and len(values) == 1 and values[0] >= 1:
        return Drafter(name, values[0])
    parser.error(f"--configs: {text!r} is not NAME,K (NAME eagle3, dflash or dspark) or eagle3,D,TOPK,N")
    raise AssertionError  # parser.error exits


# ---------------------------------------------------------------------------- heads


def block_loader():
    """specdraft.models.load_block_drafter, or None before it lands."""
    import specdraft.models

    return getattr(specdraft.models, "load_block_drafter", None)


def load_block_head(folder, target, device) -> BlockDraftHead:
    loader = block_loader()
    takes = inspect.signature(loader).parameters
    head = loader(folder, device=device) if "device" in takes else loader(folder).to(device)
    head = head.eval()
    if head.missing_weights:  # a head shipped without the target's embedding / lm_head
        head.share_from(target)
    return head


def random_block_head(kind: str, target, device) -> BlockDraftHead:
    """A stand-in of `kind` on the demo target's shapes: 2 Llama layers reading the
    target's layers 0-2 (aux layers 1-3), block 7, mask token 0 (NUL, in no prompt);
    DSpark: the vanilla Markov head of rank 32 and the confidence head with it."""
    config = dataclasses.replace(target.config, num_layers=2, target_hidden_size=target.config.hidden_size)
    dspark = kind == "dspark"
    block = BlockConfig(
        block_size=RANDOM_BLOCK_SIZE, mask_token_id=0, target_layer_ids=(0, 1, 2),
        num_target_layers=target.config.num_layers, markov_rank=32 if dspark else 0,
        markov_head_type="vanilla" if dspark else None, confidence_head=dspark, confidence_with_markov=dspark,
    )  # fmt: skip
    torch.manual_seed({"dflash": 1, "dspark": 2}[kind])
    head = BlockDraftHead(config, block).to(device).eval()
    head.share_from(target)
    return head


def block_heads(kinds, folders: dict, target, device) -> tuple[dict, dict, list[str]]:
    """(kind -> head, kind -> what its weights are: "shipped", "folder NAME" or
    "random", notes). A folder given without the loader is an error."""
    heads, weights, notes = {}, {}, []
    loader = block_loader()
    for kind in kinds:
        folder = folders.get(kind)
        if folder is not None and loader is None:
            raise SystemExit(f"--{kind} {folder}: specdraft.models has no load_block_drafter yet (it lands with the "
                             "shipped heads); run without it for random stand-in heads")  # fmt: skip
        shipped = DEMO_PAIR / kind
        if folder is None and loader is not None and shipped.is_dir():
            folder = shipped
        if folder is None:
            heads[kind], weights[kind] = random_block_head(kind, target, device), "random"
            why = "no load_block_drafter in specdraft.models" if loader is None else f"no {shipped}"
            notes.append(f"RANDOM {kind} head ({why}; pass --{kind} DIR): its acceptance length is meaningless and "
                         "its rows are not recorded")  # fmt: skip
            continue
        heads[kind] = load_block_head(folder, target, device)
        weights[kind] = "shipped" if folder == shipped else f"folder {folder}"
    return heads, weights, notes


def has_markov_op() -> bool:
    return hasattr(specdraft.ops, "markov_block_sample")


# ------------------------------------------------------------------------- decoders


def make_decoder(drafter: Drafter | None, target, eagle_head, block_heads_, num_reqs: int, max_model_len: int,
                 compile):  # fmt: skip
    """Plain decoding (drafter None) or the drafter's decoder for batches of num_reqs."""
    if drafter is None:
        return SpeculativeDecoder(target, None, max_model_len=max_model_len, block_size=BLOCK_SIZE, compile=compile)
    method = "eagle3" if drafter.name == "eagle3" else "block"
    config = SpeculativeConfig(method=method, num_speculative_tokens=drafter.k, max_model_len=max_model_len,
                               block_size=BLOCK_SIZE)  # fmt: skip
    reach = drafter.k if drafter.tree is None else drafter.tree.num_verify_tokens - 1
    head = eagle_head if drafter.name == "eagle3" else block_heads_[drafter.name]
    caches = head.allocate_kv_caches(num_kv_blocks(num_reqs, max_model_len, reach, BLOCK_SIZE), BLOCK_SIZE)
    if drafter.name != "eagle3":
        return SpeculativeDecoder(target, BlockProposer(head, config, caches), compile=compile)
    proposer = EagleProposer(head, config, caches)
    if drafter.tree is not None:
        return TreeSpeculativeDecoder(target, proposer, drafter.tree, compile=compile)
    return SpeculativeDecoder(target, proposer, compile=compile)


def batches(prompts, num_reqs: int) -> list[list[int]]:
    """Prompt indices of each batch: the prompts cycled to fill ceil(len / B) batches of B."""
    count = -(-len(prompts) // num_reqs)
    return [[(j * num_reqs + i) % len(prompts) for i in range(num_reqs)] for j in range(count)]


def decode_pass(decoder, prompts, groups, max_new_tokens: int, temperature: float) -> dict:
    """Every batch once: tokens per request, passes, accepted drafts, decoded tokens, seconds."""
    out = {"tokens": [], "passes": 0, "accepted": 0, "decoded": 0, "seconds": 0.0}
    for j, indices in enumerate(groups):
        sampling = None
        if temperature > 0:
            seeds = torch.tensor([SEED_BASE + j * len(indices) + i for i in range(len(indices))])
            sampling = SamplingParams(torch.full((len(indices),), temperature), seeds)
        result = decoder.generate([prompts[i] for i in indices], max_new_tokens=max_new_tokens, sampling=sampling)
        stats = result.stats
        out["tokens"] += [t.tolist() for t in result.tokens]
        out["passes"] += int(stats.request_passes.sum())
        out["accepted"] += int(stats.accepted_per_position.sum())
        out["decoded"] += int((stats.num_generated - 1).clamp(min=0).sum())
        out["seconds"] += float(stats.decode_time_s)
    return out


def measure(decoder, prompts, groups, max_new_tokens: int, temperature: float, repeats: int) -> dict:
    """One warm-up call (the first batch, the run's sampling: greedy and sampled batches
    compile different graphs), then `repeats` passes over every batch; the median
    pass by decode rate, with the spread of the rates."""
    first = groups[0]
    sampling = None
    if temperature > 0:
        sampling = SamplingParams(torch.full((len(first),), temperature), torch.full((len(first),), 999))
    t0 = time.perf_counter()
    decoder.generate([prompts[i] for i in first], max_new_tokens=min(40, max_new_tokens), sampling=sampling)
    warm_s = time.perf_counter() - t0
    runs = [decode_pass(decoder, prompts, groups, max_new_tokens, temperature) for _ in range(repeats)]
    rates = [r["decoded"] / r["seconds"] for r in runs]
    best = sorted(range(repeats), key=rates.__getitem__)[repeats // 2]
    run = runs[best]
    run.update(rate=rates[best], spread=(max(rates) - min(rates)) / rates[best], warm_s=warm_s,
               length=1 + run["accepted"] / run["passes"] if run["passes"] else float("nan"))  # fmt: skip
    return run


# --------------------------------------------------------------------------- report


HEADERS = ["sampling", "B", "drafter", "K", "tokens verified / pass", "acceptance length", "AL / EAGLE-3 chain (same K)",
           "request passes", "decode tokens/s", "speedup vs plain", "spread", "warm-up s", "lossless", "weights"]  # fmt: skip


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3f}"
    return "" if value is None else str(value)


def print_row(cells) -> None:
    print("| " + " | ".join(fmt(c) for c in cells) + " |", flush=True)


def record_rows(rows: list[dict], device: str, max_new_tokens: int, eager: bool) -> None:
    keys = ("drafter", "K", "topk", "N", "B", "temperature", "weights")
    kept = [r for r in rows if r["weights"] != "random"]
    append_rows("block_pair", [({**{k: r[k] for k in keys}, "max_new_tokens": max_new_tokens, "eager": eager},
                                {k: v for k, v in r.items() if k not in keys and k != "tokens"}) for r in kept],
                device=device)  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--configs", nargs="+", metavar="NAME,K", help=f"default: {' '.join(CONFIGS)}")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--sampling", choices=["greedy", "sampled", "both"], default="both",
                        help=f"sampled: temperature {TEMPERATURE}")  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the batches (median reported)")
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--eager", action="store_true", help="no compile (acceptance lengths; rates mean little)")
    parser.add_argument("--smoke", action="store_true", help="CPU, aot_eager, 2 prompts x 16 tokens: checks the script")
    for kind in BLOCK_KINDS:
        parser.add_argument(f"--{kind}", metavar="DIR", help=f"a trained {kind} head (default: the package's)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if any(b < 1 for b in args.batch_sizes):
        parser.error(f"--batch-sizes must be >= 1, got {args.batch_sizes}")
    drafters = [parse_drafter(parser, text) for text in args.configs or (SMOKE_CONFIGS if args.smoke else CONFIGS)]
    device = torch.device("cpu" if args.smoke else args.device)
    if args.smoke:
        torch.set_num_threads(1)
        compile, prompts, max_new, repeats = {"backend": "aot_eager"}, encode(PROMPTS[:2]), 16, 1
    else:
        compile = False if args.eager else compile_options(device.type, True)
        prompts, max_new, repeats = encode(PROMPTS), args.max_new_tokens, args.repeats
    temperatures = {"greedy": [0.0], "sampled": [TEMPERATURE], "both": [0.0, TEMPERATURE]}[args.sampling]
    max_model_len = max(len(p) for p in prompts) + max_new + 1
    target, eagle_head = load_demo_pair(device=device)
    kinds = sorted({d.name for d in drafters if d.name in BLOCK_KINDS})
    heads, weights, notes = block_heads(kinds, {k: getattr(args, k) for k in BLOCK_KINDS}, target, device)
    for kind, head in heads.items():
        if any(d.name == kind and d.k > head.block_size for d in drafters):
            parser.error(f"--configs: {kind} K exceeds its head's block_size {head.block_size}")
    if "dspark" in kinds and not has_markov_op():
        notes.append("DSpark needs specdraft.ops.markov_block_sample (not in this checkout): its rows are skipped")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    mode = "eager" if compile is False else ("aot_eager (smoke)" if args.smoke else "compiled")
    print(f"{name} (torch {torch.__version__}); demo pair, {len(prompts)} prompts x {max_new} new tokens, {mode}, "
          f"median of {repeats} timed passes; max_model_len {max_model_len}")  # fmt: skip
    for kind, head in heads.items():
        b = head.block
        print(f"{kind} head ({weights[kind]}): {head.config.num_layers} layers, block {b.block_size}, mask token "
              f"{b.mask_token_id}, target layers {list(b.target_layer_ids)}, Markov "
              f"{b.markov_head_type or 'none'} rank {b.markov_rank}, confidence head {b.confidence_head}")  # fmt: skip
    for note in notes:
        print(f"NOTE: {note}")
        log(f"NOTE: {note}")
    print()
    print("| " + " | ".join(HEADERS) + " |")
    print("|" + "---|" * len(HEADERS))
    start, rows, ok = time.perf_counter(), [], True
    for temperature in temperatures:
        label = "greedy" if temperature == 0 else f"T = {temperature}"
        for num_reqs in args.batch_sizes:
            groups = batches(prompts, num_reqs)
            if time.perf_counter() - start > args.budget_s:
                print_row([label, num_reqs, "all", "", "", "skipped (budget)"] + [""] * (len(HEADERS) - 6))
                continue
            torch._dynamo.reset()  # every decoder compiles the same iteration code (recompile limit 8)
            plain = measure(make_decoder(None, target, eagle_head, heads, num_reqs, max_model_len, compile), prompts,
                            groups, max_new, temperature, repeats)  # fmt: skip
            print_row([label, num_reqs, "plain", 0, 1, 1.0, "", plain["passes"], plain["rate"], 1.0, plain["spread"],
                       plain["warm_s"], "", ""])  # fmt: skip
            chain_lengths = {}
            for drafter in drafters:
                cells = [label, num_reqs, drafter.label, drafter.k, drafter.verified]
                if time.perf_counter() - start > args.budget_s:
                    print_row(cells + ["skipped (budget)"] + [""] * (len(HEADERS) - 6))
                    continue
                if drafter.name == "dspark" and not has_markov_op():
                    print_row(cells + ["skipped (no ops.markov_block_sample)"] + [""] * (len(HEADERS) - 6))
                    continue
                torch._dynamo.reset()
                try:
                    decoder = make_decoder(drafter, target, eagle_head, heads, num_reqs, max_model_len, compile)
                    run = measure(decoder, prompts, groups, max_new, temperature, repeats)
                except Exception as error:  # noqa: BLE001 - the row records it, the bench goes on
                    print_row(cells + [type(error).__name__] + [""] * (len(HEADERS) - 6))
                    log(f"{label} B={num_reqs} {drafter.label}: {error!r}")
                    ok = False
                    continue
                lossless = None if temperature > 0 else run["tokens"] == plain["tokens"]
                ok = ok and lossless is not False
                if drafter.name == "eagle3" and drafter.tree is None:
                    chain_lengths[drafter.k] = run["length"]
                versus = None
                if drafter.name in BLOCK_KINDS and drafter.k in chain_lengths:
                    versus = run["length"] / chain_lengths[drafter.k]
                row = {"drafter": drafter.name, "K": drafter.k, "topk": drafter.topk, "N": drafter.verified,
                       "B": num_reqs, "temperature": temperature, "weights": weights.get(drafter.name, "shipped"),
                       "acceptance_length": run["length"], "tokens_verified_per_pass": drafter.verified,
                       "al_vs_eagle3_chain_same_k": versus, "passes": run["passes"],
                       "decode_tokens_per_s": run["rate"], "plain_decode_tokens_per_s": plain["rate"],
                       "speedup": run["rate"] / plain["rate"], "spread": run["spread"], "warm_up_s": run["warm_s"],
                       "lossless": lossless}  # fmt: skip
                rows.append(row)
                verdict = "n/a" if lossless is None else "yes" if lossless else "FAIL"
                print_row(cells + [run["length"], versus, run["passes"], run["rate"], row["speedup"], run["spread"],
                                   run["warm_s"], verdict, row["weights"]])  # fmt: skip
                log(f"{label} B={num_reqs} {drafter.label}: AL {run['length']:.3f}, {row['speedup']:.2f}x "
                    f"({time.perf_counter() - start:.0f} s)")  # fmt: skip
    print()
    for r in rows:
        if r["al_vs_eagle3_chain_same_k"] is not None and r["drafter"] == "dspark":
            verdict = "met" if r["al_vs_eagle3_chain_same_k"] >= 1.15 else "not met"
            print(f"DSpark AL / EAGLE-3 chain AL at K = {r['K']} ({r['N']} tokens per verify), B = {r['B']}, "
                  f"T = {r['temperature']}: {r['al_vs_eagle3_chain_same_k']:.3f} (target >= 1.15: {verdict}"
                  f"{', RANDOM head' if r['weights'] == 'random' else ''})")  # fmt: skip
    if not args.smoke and rows:
        record_rows(rows, name, max_new, compile is False)
    print(f"\ntotal {time.perf_counter() - start:.0f} s (budget {args.budget_s:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
