"""`make demo`: the multi-layer EAGLE adjust-input step, compiled with
fullgraph=True, on a small batch — what each request's window looked like before
and after the shift, and what the per-request cache holds for the next step."""

import torch

from specdraft import ShiftCache, adjust_input
from specdraft.testing import CompileCounts, fresh_compile

MAX_SHIFT = 3


def example_batch(device):
    # Request 0: a decode step that accepted all drafts (sample = last token).
    # Request 1: a decode step with 2 rejected drafts: the window moves right by 2,
    #            its first 2 tokens coming from the cache of the previous step.
    # Request 2: a prefill at position 0: nothing to shift.
    qsl = torch.tensor([0, 4, 9, 15], dtype=torch.int32, device=device)
    positions = torch.tensor([20, 21, 22, 23, 50, 51, 52, 53, 54, 0, 1, 2, 3, 4, 5], device=device)
    token_ids = torch.tensor([101, 102, 103, 104, 201, 202, 203, 204, 205, 1, 2, 3, 4, 5, 6],
                             dtype=torch.int32, device=device)  # fmt: skip
    cached_token_ids = torch.tensor([[97, 98, 99], [190, 198, 199], [0, 0, 0]], dtype=torch.int32, device=device)
    cached_positions = torch.tensor([[17, 18, 19], [47, 48, 49], [0, 0, 0]], device=device)
    cache = ShiftCache.zeros(3, MAX_SHIFT, 4, dtype=torch.float32, device=device, slot_mapping=False)
    cache.token_ids.copy_(cached_token_ids)
    cache.positions.copy_(cached_positions)
    cache.hidden_states.copy_(cached_token_ids.float()[:, :, None].expand(3, MAX_SHIFT, 4))
    cache.cached_lens.copy_(torch.tensor([3, 3, 0]))
    return {
        "token_ids": token_ids,
        "positions": positions,
        "hidden_states": (token_ids.float()[:, None] + torch.arange(4.0, device=device) / 10).contiguous(),
        "query_start_loc": qsl,
        "seq_lens": torch.tensor([24, 55, 6], dtype=torch.int32, device=device),
        "cache": cache,
        "token_indices_to_sample": torch.tensor([3, 6, 14], dtype=torch.int32, device=device),
        "max_query_len": 6,
    }


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    eager_in, compiled_in = example_batch(device), example_batch(device)
    # The .tolist() / .item() calls below only print results, outside the compiled
    # function: the host syncs are the point of a display.
    qsl = eager_in["query_start_loc"].tolist()
    print(f"device: {device}; 3 requests, MAX_SHIFT={MAX_SHIFT}\n")
    for b in range(3):
        window = eager_in["token_ids"][qsl[b] : qsl[b + 1]].tolist()
        print(f"request {b}: window {window}, sample index {eager_in['token_indices_to_sample'][b].item()}, "
              f"cache {eager_in['cache'].token_ids[b].tolist()} (len {eager_in['cache'].cached_lens[b].item()})")  # fmt: skip

    eager = adjust_input(**eager_in)
    compiled_fn = fresh_compile(adjust_input, fullgraph=True)
    with CompileCounts.measure() as counts:
        out = compiled_fn(**compiled_in)

    print("\nafter adjust_input (compiled, fullgraph=True):")
    for b in range(3):
        window, positions = out.token_ids[qsl[b] : qsl[b + 1]].tolist(), out.positions[qsl[b] : qsl[b + 1]].tolist()
        print(f"request {b}: shift {out.shift[b].item()}, window {window}, positions {positions}, "
              f"sample index {out.token_indices_to_sample[b].item()}, seq_len {out.seq_lens[b].item()}")  # fmt: skip
        cache = compiled_in["cache"]
        print(f"           new cache {cache.token_ids[b].tolist()} (len {cache.cached_lens[b].item()})")

    same = all(torch.equal(a, b) for a, b in zip(eager, out, strict=True) if a is not None)
    for name in ("token_ids", "positions", "hidden_states", "cached_lens"):
        same &= torch.equal(getattr(eager_in["cache"], name), getattr(compiled_in["cache"], name))
    print(f"\ncompiled == eager: {same}; graphs compiled: {counts.compiles}; graph breaks: {counts.graph_breaks}")
    if not same or counts.graph_breaks:
        raise SystemExit("demo failed: compiled result differs from eager or the graph broke")


if __name__ == "__main__":
    main()
