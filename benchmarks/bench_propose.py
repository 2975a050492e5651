"""The K-step propose loop of a Llama-3-8B-shaped EAGLE head (hidden 4096, 32/8
heads, one layer, vocab 128256, random bf16 weights): eager vs torch.compile vs
mode="reduce-overhead", against the floor: the K draft forwards alone (the same
model calls with the metadata prepared outside, argmax sampling), compiled and
captured as one CUDA graph too.

    python benchmarks/bench_propose.py --k 3      # B = 1, 8, 64, 256
    python benchmarks/bench_propose.py --k 5

Decode-shaped batches: each request verified K + 1 target tokens after a
512-token context. Times are wall-clock per call (events around the call, launch
overhead included: that is what reduce-overhead removes), medians in µs.
"""

import argparse

import torch
from harness import device_name, emit, markdown_table
from record import append_table
from triton.testing import do_bench

from specdraft.config import SpeculativeConfig
from specdraft.layout import BatchMetadata
from specdraft.models import DraftModelConfig, EagleHead
from specdraft.proposers import EagleProposer
from specdraft.testing.proposers import make_draft_batch

CONTEXT, BLOCK_SIZE = 512, 16
BLOCKS_PER_REQUEST = (CONTEXT + 16 + BLOCK_SIZE - 1) // BLOCK_SIZE


def llama8b_head() -> EagleHead:
    config = DraftModelConfig(
        hidden_size=4096, intermediate_size=14336, num_heads=32, num_kv_heads=8, vocab_size=128256,
        rope_theta=500000.0, dtype=torch.bfloat16,
    )  # fmt: skip
    torch.manual_seed(0)
    head = EagleHead(config).to("cuda").eval()
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return head


def decode_batch(num_reqs: int, k: int):
    batch = make_draft_batch([k + 1] * num_reqs, vocab_size=128256, target_hidden_size=4096, block_size=BLOCK_SIZE,
                             blocks_per_request=BLOCKS_PER_REQUEST, start_positions=[CONTEXT] * num_reqs,
                             device="cuda", dtype=torch.bfloat16)  # fmt: skip
    return batch


def forwards_alone_inputs(batch, k):
    """Inputs of the floor: the first pass's, and each later step's positions and
    attention metadata, all computed here, outside the timed region."""
    md = batch.metadata
    num_reqs = md.num_reqs
    last = md.query_start_loc[1:].long() - 1
    steps = []
    for step in range(1, k):
        pos = batch.target_positions[last] + step
        slots = md.block_table.gather(1, (pos // BLOCK_SIZE)[:, None].to(torch.int64)).view(-1).long() * BLOCK_SIZE
        step_md = BatchMetadata(torch.arange(num_reqs + 1, dtype=torch.int32, device="cuda"), md.seq_lens + step,
                                    md.block_table, slots + pos % BLOCK_SIZE, 1, md.max_seq_len)  # fmt: skip
        steps.append((pos, step_md))
    first_md = BatchMetadata(
        md.query_start_loc, md.seq_lens, md.block_table, md.slot_mapping, md.max_query_len, md.max_seq_len
    )
    return (batch.target_token_ids, batch.target_positions, batch.target_hidden_states, first_md, last, steps)


def forwards_alone(head, kv, ids, positions, hidden, first_md, last, steps):
    """The K model calls of the loop and argmax sampling, nothing else: the floor."""
    h, h_next = head(ids, positions, hidden, first_md, kv)
    token = head.compute_logits(h[last]).argmax(-1)
    h_next = h_next[last]
    for pos, step_md in steps:
        h, h_next = head(token, pos, h_next, step_md, kv)
        token = head.compute_logits(h).argmax(-1)
    return token


def time_call(fn) -> float:
    return do_bench(fn, warmup=50, rep=300, return_mode="median") * 1e3


def graph_call(compiled):
    def call(*args):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args)

    return call


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, nargs="+", default=[3, 5], help="numbers of speculative tokens")
    opts = parser.parse_args()
    head = llama8b_head()
    batch_sizes = (1, 8, 64, 256)
    # One cache for the largest batch; smaller batches use a prefix of its blocks.
    kv = head.allocate_kv_caches(max(batch_sizes) * BLOCKS_PER_REQUEST, BLOCK_SIZE, device="cuda")
    torch._dynamo.config.cache_size_limit = 64
    rows = []
    with torch.no_grad():
        for k in opts.k:
            config = SpeculativeConfig(
                method="eagle", num_speculative_tokens=k, max_model_len=4096, block_size=BLOCK_SIZE
            )
            proposer = EagleProposer(head, config, kv)
            # Static shapes, one graph per batch size, as an engine captures per size
            # (torch 2.11's Inductor fails on this loop with dynamic=True: pytorch#181735).
            compiled = torch.compile(proposer.propose, fullgraph=True, dynamic=False)
            reduced = graph_call(torch.compile(proposer.propose, fullgraph=True, dynamic=False, mode="reduce-overhead"))
            floor = graph_call(torch.compile(forwards_alone, fullgraph=True, dynamic=False, mode="reduce-overhead"))
            for num_reqs in batch_sizes:
                batch = decode_batch(num_reqs, k)
                args, floor_args = batch.propose_args(), (head, kv, *forwards_alone_inputs(batch, k))
                eager_us = time_call(lambda fn=proposer.propose, args=args: fn(*args))
                compiled_us = time_call(lambda fn=compiled, args=args: fn(*args))
                reduced_us = time_call(lambda fn=reduced, args=args: fn(*args))
                floor_us = time_call(lambda fn=floor, args=floor_args: fn(*args))
                rows.append([k, num_reqs, eager_us, compiled_us, reduced_us, floor_us, reduced_us / floor_us,
                             eager_us / reduced_us])  # fmt: skip
                print(rows[-1], flush=True)
    headers = ["K", "B", "eager µs", "compiled µs", "reduce-overhead µs", "K forwards alone (compiled, graph) µs",
               "reduce-overhead / forwards", "eager / reduce-overhead"]  # fmt: skip
    emit(f"propose_k{'_'.join(map(str, opts.k))}",
         f"Device: {device_name()}. Llama-3-8B-shaped EAGLE head, bf16, greedy, context {CONTEXT}.\n\n"
         + markdown_table(headers, rows))  # fmt: skip
    append_table("propose", headers, rows, config_columns=2)


if __name__ == "__main__":
    main()
