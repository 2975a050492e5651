"""Check specdraft's block drafters once against DeepSeek's own DeepSpec modules (not
part of CI: it needs a DeepSpec checkout and transformers).

    python scripts/check_against_deepspec.py --deepspec /path/to/DeepSpec

For each backbone (Qwen3DSparkModel, Gemma4DSparkModel) and each head (DFlash; DSpark
with a vanilla, gated and rnn Markov head, each without and with the confidence head),
a random fp32 DeepSpec model is built, saved with save_pretrained and loaded with
specdraft's loader (load_draft_model). Then a batch of two running sequences goes
block by block through specdraft's BlockProposer (paged context cache, random
acceptance) while each sequence runs DeepSpec's cached inference on its own
DynamicCache (draft_ops.forward_dspark_draft_block, compute_logits,
sample_draft_tokens, predict_confidence_step, greedy): block logits, Markov-corrected
logits, greedy tokens and confidence logits must agree at <= 1e-5. Until
specdraft.ops.markov_block_sample exists, a DSpark head's corrected logits come from
the proposer's block forward and the head's teacher-forced markov_bias (fed DeepSpec's
tokens) instead of propose. Last, specdraft's save_block_drafter output is read back
by DeepSpec's from_pretrained and must hold the same tensors.

transformers 5.24 shims (DeepSpec pins 5.10.2): DynamicCache.crop(n) with the old
meaning "keep n" (5.24 takes the number to drop, negative), Gemma4TextRotaryEmbedding
without its layer_type argument, and Gemma4TextConfig's global_head_dim /
num_global_key_value_heads (5.24 folds them away) set back as attributes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

BLOCK, VOCAB, HIDDEN, MASK = 5, 96, 64, 5
TARGET_LAYER_IDS, NUM_TARGET_LAYERS = [-1, 0, 2], 4
TOL = 1e-5


def import_oracles():
    """The float64 oracles of the CI tests (tests/models/block_oracle.py,
    block_gemma4_oracle.py): checked against DeepSpec here too."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.models.block_gemma4_oracle import Gemma4OracleDrafter
    from tests.models.block_oracle import OracleDrafter

    return OracleDrafter, Gemma4OracleDrafter


OracleDrafter, Gemma4OracleDrafter = import_oracles()


def import_deepspec(path: str):
    sys.path.insert(0, path)
    import deepspec.eval.dspark.draft_ops as draft_ops
    import deepspec.modeling.dspark.gemma4.modeling as gemma_modeling
    from deepspec.modeling.dspark.qwen3 import Qwen3DSparkModel
    from transformers import DynamicCache
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    class Rotary(Gemma4TextRotaryEmbedding):
        def __init__(self, config, device=None, layer_type=None):
            super().__init__(config, device)

    gemma_modeling.Gemma4TextRotaryEmbedding = Rotary

    class Cache(DynamicCache):
        def crop(self, max_length):  # 5.10's meaning: keep max_length tokens
            super().crop(max_length - self.get_seq_length() if max_length >= 0 else max_length)

    return draft_ops, Cache, Qwen3DSparkModel, gemma_modeling.Gemma4DSparkModel


def head_keys(markov, confidence):
    keys = {"block_size": BLOCK, "mask_token_id": MASK, "target_layer_ids": TARGET_LAYER_IDS,
            "num_target_layers": NUM_TARGET_LAYERS, "num_anchors": 8, "markov_rank": 16 if markov else 0,
            "enable_confidence_head": confidence}  # fmt: skip
    if markov:
        keys["markov_head_type"] = markov
    if confidence:
        keys["confidence_head_with_markov"] = bool(markov)
    return keys


def qwen3_config(keys):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                       rope_theta=10000.0, layer_types=["full_attention"] * 2, tie_word_embeddings=False, **keys)  # fmt: skip


def gemma4_config(keys, k_eq_v=True, bias=False):
    from transformers import Gemma4TextConfig

    cfg = Gemma4TextConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=32,
                           num_global_key_value_heads=1, attention_k_eq_v=k_eq_v, attention_bias=bias,
                           hidden_size_per_layer_input=0,
                           enable_moe_block=False, num_kv_shared_layers=0, use_double_wide_mlp=False,
                           hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=3.0,
                           rope_parameters={"full_attention": {"rope_type": "proportional",
                                                               "partial_rotary_factor": 0.25,
                                                               "rope_theta": 10000.0}},
                           layer_types=["full_attention"] * 2, tie_word_embeddings=False, **keys)  # fmt: skip
    cfg.global_head_dim, cfg.num_global_key_value_heads = 32, 1  # 5.24 folds these away
    return cfg


def randomize(model, seed):
    """Weights of unit-scale activations (DeepSpec's init leaves them tiny and the
    norms at 1, where a wrong norm would not show)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("embed_tokens.weight") or name.endswith("markov_w1.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))


def deepspec_block(model, draft_ops, cache, features, start, newest, positions):
    """DeepSpec's greedy inference of one block at `start`: (base logits [B, V],
    corrected [B, V], tokens [B], confidence [B] or None)."""
    draft_in = torch.full((1, BLOCK), model.mask_token_id)
    draft_in[0, 0] = newest
    hidden = draft_ops.forward_dspark_draft_block(
        model, draft_input_ids=draft_in, position_ids=positions, past_key_values_draft=cache,
        target_hidden_states=features[None], start=start, block_size=BLOCK,
    )  # fmt: skip
    assert cache.get_seq_length() == start
    base = model.compute_logits(hidden)
    tokens, corrected = model.sample_draft_tokens(base, first_prev_token_ids=draft_in[:, 0], temperature=0.0,
                                                  hidden_states=hidden)  # fmt: skip
    prev = torch.cat([draft_in[:, :1], tokens[:, :-1]], dim=1)
    conf = model.predict_confidence_step(hidden, prev_token_ids=prev)
    proposal = draft_ops.build_dspark_proposal(model, draft_input_ids=draft_in, block_hidden=hidden,
                                               block_size=BLOCK, temperature=0.0, confidence_threshold=0.0)  # fmt: skip
    assert proposal.verify_input_ids[0, 1:].tolist() == tokens[0].tolist()
    return base[0], corrected[0], tokens[0], None if conf is None else conf[0]


def window_metadata(starts, lens, table_width, cache_block):
    from specdraft.layout import BatchMetadata

    b = len(starts)
    table = torch.arange(b * table_width, dtype=torch.int32).view(b, table_width)
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
    owner = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    slots = table[owner, positions // cache_block].long() * cache_block + positions % cache_block
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor([s + n for s, n in zip(starts, lens, strict=True)], dtype=torch.int32)
    return positions, BatchMetadata(qsl, seq_lens, table, slots, max_query_len=max(lens))


def compare(name, head, deepspec_model, draft_ops, cache_cls, has_op, gen):
    """Runs both over two running sequences; returns the worst differences."""
    from specdraft.config import SpeculativeConfig
    from specdraft.proposers.block import BlockProposer, block_forward, write_context
    from specdraft.proposers.loop import TargetWindow, sample_rows

    cache_block, table_width, total = 4, 16, 48
    prompts = [9, 4]
    tokens = [torch.randint(MASK + 1, VOCAB, (total,), generator=gen) for _ in prompts]
    features = [torch.randn(total, head.hidden_width, generator=gen) for _ in prompts]
    config = SpeculativeConfig(method="block", num_speculative_tokens=BLOCK, max_model_len=total,
                               block_size=cache_block, return_probs="logits")  # fmt: skip
    proposer = BlockProposer(head, config, head.allocate_kv_caches(len(prompts) * table_width, cache_block))
    caches = [cache_cls() for _ in prompts]
    oracle_cls = Gemma4OracleDrafter if hasattr(head, "gemma") else OracleDrafter
    oracles = [oracle_cls(head) for _ in prompts]
    worst = {"block logits": 0.0, "corrected logits": 0.0, "confidence logits": 0.0, "oracle": 0.0}
    token_rows = blocks = 0

    def diff(key, ours, theirs):
        worst[key] = max(worst[key], (ours.double() - theirs.double()).abs().max().item())

    starts, lens, context_end = [0, 0], list(prompts), list(prompts)
    sample_at = rejected = None
    for _ in range(5):
        positions, meta = window_metadata(starts, lens, table_width, cache_block)
        hidden_in = torch.cat([f[s : s + n] for f, s, n in zip(features, starts, lens, strict=True)])
        newest = torch.stack([t[e] for t, e in zip(tokens, context_end, strict=True)])
        window = proposer.checked_window(
            TargetWindow(torch.zeros_like(positions), positions, hidden_in, newest, meta, sample_at, rejected), None
        )
        _, context_lens = sample_rows(window.metadata, window.token_indices_to_sample, window.num_rejected_tokens)
        with torch.no_grad():
            write_context(head, proposer.kv_caches, window)
            hidden = block_forward(head, proposer.kv_caches, newest, context_lens, window.metadata)
            base = head.compute_logits(hidden)
            out = None
            if head.markov_head is None or has_op:
                out = proposer.propose(torch.zeros_like(positions), positions, hidden_in, newest, meta,
                                       token_indices_to_sample=sample_at, num_rejected_tokens=rejected)  # fmt: skip
        for b in range(len(prompts)):
            lo, end = starts[b], context_end[b]
            with torch.no_grad():
                their_base, corrected, drafts, conf = deepspec_block(
                    deepspec_model, draft_ops, caches[b], features[b][lo:end], end, tokens[b][end],
                    torch.arange(end + BLOCK)[None],
                )  # fmt: skip
                prev = torch.cat([tokens[b][end].view(1), drafts[:-1]])
                diff("block logits", base[b], their_base)
                ours = base[b] if head.markov_head is None else base[b] + head.markov_bias(prev, hidden[b])
                diff("corrected logits", ours, corrected)
                ours_tokens = ours.argmax(-1)
                our_conf = head.confidence_logits(hidden[b], prev)
            if out is not None:
                diff("corrected logits", out.draft_probs[b], corrected)
                ours_tokens = out.draft_tokens[b]
                our_conf = out.confidence_logits[b] if out.confidence_logits is not None else None
            assert (our_conf is None) == (conf is None), name
            if conf is not None:
                diff("confidence logits", our_conf, conf)
            assert ours_tokens.tolist() == drafts.tolist(), (name, ours_tokens.tolist(), drafts.tolist())
            oracle_hidden = oracles[b].block_step(features[b][lo:end], torch.arange(lo, end), tokens[b][end], end)
            _, oracle_corrected, oracle_tokens, oracle_conf = oracles[b].draft(oracle_hidden, tokens[b][end])
            diff("oracle", oracle_corrected, corrected)
            if conf is not None:
                diff("oracle", oracle_conf, conf)
            assert oracle_tokens.tolist() == drafts.tolist(), (name, "oracle")
            token_rows += BLOCK
            blocks += 1
        accepted = torch.randint(0, BLOCK + 1, (len(prompts),), generator=gen).tolist()
        starts, lens = list(context_end), [BLOCK + 1] * len(prompts)
        context_end = [s + a + 1 for s, a in zip(starts, accepted, strict=True)]
        rejected = torch.tensor([BLOCK - a for a in accepted])
        sample_at = torch.tensor([i * (BLOCK + 1) + a for i, a in enumerate(accepted)])
    return worst, blocks, token_rows, out is not None


def check_deepspec_reads_ours(head, model_cls, folder, is_gemma):
    """save_block_drafter -> DeepSpec's from_pretrained: the same tensors."""
    from specdraft.models.block_saving import save_block_drafter

    save_block_drafter(head, folder)
    config = None
    if is_gemma:
        from transformers import Gemma4TextConfig

        raw = json.loads((Path(folder) / "config.json").read_text())
        config = Gemma4TextConfig.from_pretrained(folder)
        config.global_head_dim, config.num_global_key_value_heads = (
            raw["global_head_dim"],
            raw["num_global_key_value_heads"],
        )
    kwargs = {"config": config} if config is not None else {}
    model = model_cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa", **kwargs)
    theirs, ours = model.state_dict(), head.state_dict()
    assert set(theirs) == set(ours), sorted(set(theirs) ^ set(ours))
    return max((theirs[k].double() - ours[k].double()).abs().max().item() for k in ours)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deepspec", required=True, help="a DeepSpec checkout (its deepspec/ package inside)")
    args = parser.parse_args()
    torch.set_default_dtype(torch.float32)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    draft_ops, cache_cls, qwen3_cls, gemma4_cls = import_deepspec(args.deepspec)
    import specdraft.ops
    from specdraft.models import load_draft_model

    has_op = hasattr(specdraft.ops, "markov_block_sample")
    cases = [("dflash", None, False, {})]
    for markov in ("vanilla", "gated", "rnn"):
        cases += [(f"dspark-{markov}", markov, False, {}), (f"dspark-{markov}+confidence", markov, True, {})]
    gemma_only = [("dflash, v_proj + biases", None, False, {"k_eq_v": False, "bias": True}),
                  ("dspark-gated+confidence, v_proj + biases", "gated", True, {"k_eq_v": False, "bias": True})]  # fmt: skip
    runs = [("Qwen3DSparkModel", qwen3_cls, qwen3_config, c) for c in cases]
    runs += [("Gemma4DSparkModel", gemma4_cls, gemma4_config, c) for c in cases + gemma_only]
    failures = 0
    gen = torch.Generator().manual_seed(0)
    print(f"specdraft.ops.markov_block_sample available: {has_op} (DSpark through "
          f"{'BlockProposer.propose' if has_op else 'the block forward + teacher-forced markov_bias'})")  # fmt: skip
    print("| backbone | head | blocks | draft tokens | block logits | corrected logits | confidence logits | "
          "greedy tokens | float64 test oracle | save -> DeepSpec from_pretrained |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for seed, (arch, cls, make_config, (label, markov, confidence, extra)) in enumerate(runs):
        cfg = make_config(head_keys(markov, confidence), **extra)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(seed)
        model = cls(cfg).float().eval()
        randomize(model, seed)
        with tempfile.TemporaryDirectory() as theirs, tempfile.TemporaryDirectory() as ours:
            model.save_pretrained(theirs)
            head = load_draft_model(theirs).eval()
            worst, blocks, rows, proposed = compare(f"{arch} {label}", head, model, draft_ops, cache_cls, has_op, gen)
            readback = check_deepspec_reads_ours(head, cls, ours, arch.startswith("Gemma4"))
        ok = max(worst.values()) <= TOL and readback == 0.0
        failures += not ok
        conf = f"{worst['confidence logits']:.1e}" if confidence else "-"
        print(f"| {arch} | {label} | {blocks} | {rows} | {worst['block logits']:.1e} | "
              f"{worst['corrected logits']:.1e} | {conf} | equal | {worst['oracle']:.1e} | {'equal' if readback == 0.0 else readback} |"
              + ("" if ok else " FAIL"))  # fmt: skip
    print(f"\n{'all agree' if not failures else f'{failures} FAILED'} (tolerance {TOL:g}, fp32)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
