"""The 8B-shaped model passes against the copy roofline: the target's verify forward
over N tokens (with its logits) and the EAGLE-3 head's single-token draft step, B =
1, bf16, each compiled and captured alone in a CUDA graph; bytes streamed / time as
a share of device-to-device copy bandwidth (harness.copy_bandwidth_gbs: read +
write of 1 GiB). Each attention form in the same run, side by side:

- kernel: the models' attention (specdraft.models.attention over
  ops.masked_paged_attention: split over the keys, read through their slots);
- sdpa: its torch reference (the keys gathered, one scaled_dot_product_attention in
  the input dtype, fp32 accumulation);
- fp32: the einsum form before both, q, K and V upcast to fp32 (the A/B switch
  attention.ATTENTION_FORM, set before each fresh compile).

Also the cold compile of each target forward (the first call's wall time, Inductor
and Triton caches as the machine has them: say which in the row).

    python3 benchmarks/bench_roofline.py                 # GPU: 32 layers, N = 1, 4, 16
    python3 benchmarks/bench_roofline.py --smoke         # CPU, tiny sizes, aot_eager

Bytes: the target's parameters but the input embedding (N rows of it are read) +
the KV the attention reads (the block table's reach, every layer); the draft step's
as bench_generate.step_weight_bytes.
"""

import argparse
import time

import torch
from bench_generate import BLOCK_SIZE, Device, build_8b, floor_fns, kernel_list, log, step_weight_bytes, table
from record import append_table

from specdraft.config import SpeculativeConfig
from specdraft.generation import SpeculativeDecoder, num_kv_blocks
from specdraft.models import attention
from specdraft.proposers import EagleProposer

MAX_MODEL_LEN = 1024
PROMPT_LEN = 128


def target_bytes(target, reach: int) -> int:
    weights = sum(p.numel() * p.element_size() for n, p in target.named_parameters() if "embed_tokens" not in n)
    cfg = target.config
    head_dim = cfg.hidden_size // cfg.num_heads
    kv = 2 * cfg.num_layers * reach * cfg.num_kv_heads * head_dim * torch.finfo(cfg.dtype).bits // 8
    return weights + kv


def measure(dev: Device, target, head, num_tokens: int, form: str, profile: bool) -> dict:
    attention.ATTENTION_FORM = form
    torch._dynamo.reset()
    k = num_tokens - 1
    config = SpeculativeConfig(method="eagle3", num_speculative_tokens=max(k, 1), max_model_len=MAX_MODEL_LEN,
                               block_size=BLOCK_SIZE)  # fmt: skip
    caches = head.allocate_kv_caches(num_kv_blocks(1, MAX_MODEL_LEN, max(k, 1), BLOCK_SIZE), BLOCK_SIZE)
    decoder = SpeculativeDecoder(target, EagleProposer(head, config, caches), compile=False)
    decoder.k = k  # the window the floor functions feed: N = k + 1 tokens
    gen = torch.Generator().manual_seed(0)
    prompt = [torch.randint(0, target.config.vocab_size, (PROMPT_LEN,), generator=gen).tolist()]
    prompts, requests = decoder.requests(prompt, 64, None, None)
    with torch.no_grad():
        state = decoder.prefill(prompts, requests)
        state.drafts = state.drafts[:, :k]
        target_fn, _, step_fn = floor_fns(dev, decoder, state, requests)
        dev.sync()
        start = time.perf_counter()
        target_fn()
        dev.sync()
        cold_s = time.perf_counter() - start
        target_us = dev.time_us(target_fn, graph=not dev.smoke)
        step_us = dev.time_us(step_fn, graph=not dev.smoke)
        if profile and not dev.smoke:
            log(f"kernels of the target forward, N = {num_tokens}, {form}:\n" + kernel_list(target_fn))
    return {"target_us": target_us, "step_us": step_us, "cold_s": cold_s, "reach": decoder.reach}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, aot_eager: a check of the script")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--forms", nargs="+", default=["kernel", "sdpa", "fp32"], choices=["kernel", "sdpa", "fp32"])
    parser.add_argument("--profile", action="store_true", help="log each target forward's kernels (stderr)")
    args = parser.parse_args(argv)
    dev = Device(args.smoke)
    target, head = build_8b(dev, 2 if args.smoke else args.layers, 256 if args.smoke else 32000)
    step_bytes = step_weight_bytes(head)
    copy = None
    if not dev.smoke:
        from harness import copy_bandwidth_gbs

        copy = copy_bandwidth_gbs()
    rows = []
    for num_tokens in args.tokens:
        for form in args.forms:
            got = measure(dev, target, head, num_tokens, form, args.profile)
            nbytes = target_bytes(target, got["reach"])
            rate = nbytes / (got["target_us"] * 1e-6) / 1e9
            step_rate = step_bytes / (got["step_us"] * 1e-6) / 1e9
            share = (lambda r: round(100 * r / copy, 1)) if copy else (lambda r: "")
            rows.append([num_tokens, form, round(got["target_us"], 1), round(nbytes / 1e9, 3), round(rate),
                         share(rate), round(got["step_us"], 1), round(step_bytes / 1e6), round(step_rate),
                         share(step_rate), round(got["cold_s"], 1)])  # fmt: skip
            log(f"N = {num_tokens}, {form}: target {got['target_us']:.0f} µs ({rate:.0f} GB/s), draft step "
                f"{got['step_us']:.1f} µs ({step_rate:.0f} GB/s), cold compile {got['cold_s']:.1f} s")  # fmt: skip
    headers = ["N", "attention", "target fwd µs", "target GB", "target GB/s", "target % of copy", "draft step µs",
               "draft step MB", "draft step GB/s", "draft step % of copy", "target cold compile s"]  # fmt: skip
    print(f"copy bandwidth (read + write): {copy:.0f} GB/s\n" if copy else "", end="")
    print(table(headers, rows))
    if not dev.smoke:
        append_table("roofline", headers, rows, config_columns=2,
                     config={"target": f"8B-shaped, {args.layers} of 32 layers, bf16, B = 1",
                             "copy_gbs": round(copy)})  # fmt: skip


if __name__ == "__main__":
    main()
