"""Builders for the generate tests: small random TinyTargetModels, and every proposer
generate supports, either random (drafts mostly rejected) or built from the
target's own weights (drafts mostly accepted). Exposed as the `build` fixture; `pair`
is the shipped demo pair.

Block drafters (DFlash, DSpark: fixtures.block_drafters) draft a block of
`head_block_size` (default K) tokens; their copy heads pair with a target whose
layers barely move its residual stream (make_target's context_weight), so that it
mostly continues with the token its embedding alone predicts (`bigram_map`)."""

import pytest
import torch

from specdraft.config import SpeculativeConfig
from specdraft.generation import num_kv_blocks
from specdraft.models import DraftModelConfig, Eagle3Head, EagleHead, MTPHead, TinyTargetModel
from specdraft.proposers import AutoregressiveSpeculator, DraftLM, EagleProposer, MultiLayerEagleProposer
from specdraft.proposers.block import BlockProposer

from fixtures.block_drafters import BLOCK_KINDS, bigram_map, block_copy_head, block_head

VOCAB = 64
HIDDEN = 32
BLOCK_SIZE = 4
MAX_REQS = 8  # draft caches are sized for this many requests


@pytest.fixture(scope="module")
def pair(device):
    """The shipped demo pair (target, EAGLE-3 head) on the lane's device
    (SPECDRAFT_DEVICE=cuda: the ops' kernels)."""
    from specdraft.assets import load_demo_pair

    torch.manual_seed(0)
    return load_demo_pair(device=device)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls: one thread is several times faster on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def model_config(vocab=VOCAB, hidden=HIDDEN, **overrides) -> DraftModelConfig:
    fields = dict(hidden_size=hidden, intermediate_size=48, num_heads=4, num_kv_heads=2, vocab_size=vocab)
    fields.update(overrides)
    return DraftModelConfig(**fields)


def make_target(
    num_layers=2, vocab=VOCAB, seed=0, logit_scale=1.0, unit_embeddings=False, context_weight=1.0
) -> TinyTargetModel:
    """A random target. logit_scale sharpens its distribution; unit_embeddings gives
    every embedding row RMS 1 (so an MTP layer's enorm leaves it unchanged);
    context_weight scales what each layer adds to the residual stream (its o_proj
    and down_proj): near 0 the next token is mostly `bigram_map`'s of the last one."""
    torch.manual_seed(seed)
    target = TinyTargetModel(model_config(vocab=vocab, num_layers=num_layers)).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(logit_scale)
        if unit_embeddings:
            w = target.embed_tokens.weight
            w.div_(w.pow(2).mean(-1, keepdim=True).sqrt())
        for layer in target.layers:
            layer.self_attn.o_proj.weight.mul_(context_weight)
            layer.mlp.down_proj.weight.mul_(context_weight)
    return target


def spec_config(method, k, max_model_len, **overrides) -> SpeculativeConfig:
    return SpeculativeConfig(
        method=method, num_speculative_tokens=k, max_model_len=max_model_len, block_size=BLOCK_SIZE, **overrides
    )


def random_head(kind, target, k, seed):
    torch.manual_seed(seed + 100)
    vocab = target.config.vocab_size
    if kind == "eagle":
        return EagleHead(model_config(vocab=vocab)).eval(), "eagle"
    if kind == "eagle3":
        # A draft vocabulary of half the target's, mapped onto a random subset.
        draft_vocab = vocab // 2
        head = Eagle3Head(model_config(vocab=vocab, draft_vocab_size=draft_vocab, target_hidden_size=HIDDEN)).eval()
        targets = torch.randperm(vocab)[:draft_vocab].sort().values
        head.d2t.copy_(targets - torch.arange(draft_vocab))
        head.t2d.zero_()[targets] = True
        return head, "eagle3"
    if kind == "mtp":
        return MTPHead(model_config(vocab=vocab)).eval(), "mtp"
    if kind == "multi_layer":
        return MTPHead(model_config(vocab=vocab, n_predict=k)).eval(), "mtp"
    if kind == "autoregressive":
        return DraftLM(TinyTargetModel(model_config(vocab=vocab, num_layers=1)).eval()), "eagle"
    if kind in BLOCK_KINDS:
        return block_head(kind, target, k, mask_token_id=vocab - 1, markov_rank=8), "block"
    raise ValueError(kind)


def _copy_layer(dst, src) -> None:
    """A draft decoder layer takes the target layer's attention, norms and MLP."""
    for name in ("self_attn", "post_attention_layernorm", "mlp", "input_layernorm"):
        getattr(dst, name).load_state_dict(getattr(src, name).state_dict())


def _pass_embedding(linear) -> None:
    """[emb; hidden] -> emb: the head ignores the target's hidden state."""
    h = linear.weight.shape[0]
    with torch.no_grad():
        linear.weight.zero_()
        linear.weight[:, :h] = torch.eye(h)


def copy_head(kind, target, k, noise=0.0):
    """A draft built from a 1-layer target's weights: it runs the target's layer over
    the sequence without its first token(s), so it predicts what the target does
    (RoPE sees relative positions only) and most drafts are accepted; `noise` (a
    perturbation of its MLP weights) makes some of them rejected."""
    if kind in BLOCK_KINDS:
        return block_copy_head(kind, target, k, noise), "block"
    assert target.config.num_layers == 1
    if kind == "autoregressive":
        return DraftLM(target), "eagle"  # the target itself: every draft accepted
    head, method = _copied_head(kind, target, k)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, weight in head.named_parameters():
            if ".mlp." in name:
                weight.add_(noise * torch.randn(weight.shape, generator=gen))
    return head, method


def _copied_head(kind, target, k):
    layer = target.layers[0]
    if kind == "eagle":
        head = EagleHead(target.config, input_norm=True).eval()
        _copy_layer(head.layers[0], layer)
        _pass_embedding(head.fc)
        head.norm.load_state_dict(target.norm.state_dict())
        head.share_from(target)
        return head, "eagle"
    n_predict = k if kind == "multi_layer" else 1
    head = MTPHead(model_config(n_predict=n_predict), mask_position_zero=False).eval()
    for mtp_layer in head.layers:
        _copy_layer(mtp_layer, layer)
        _pass_embedding(mtp_layer.eh_proj)  # enorm(emb) == emb: the target's embeddings have RMS 1
        mtp_layer.shared_head.norm.load_state_dict(target.norm.state_dict())
    head.share_from(target)
    return head, "mtp"


def make_proposer(
    kind, target, k, *, max_model_len, copy=False, noise=0.0, seed=0, max_reqs=MAX_REQS, head_block_size=None,
    **config_overrides,
):  # fmt: skip
    """head_block_size: a block drafter's block (default K; K <= it)."""
    drafted = k if head_block_size is None else head_block_size
    head, method = copy_head(kind, target, drafted, noise) if copy else random_head(kind, target, drafted, seed)
    config = spec_config(method, k, max_model_len, **config_overrides)
    caches = head.allocate_kv_caches(num_kv_blocks(max_reqs, max_model_len, k, BLOCK_SIZE), BLOCK_SIZE)
    if kind in BLOCK_KINDS:
        return BlockProposer(head, config, caches)
    if kind == "multi_layer":
        return MultiLayerEagleProposer(head, config, caches, max_num_reqs=max_reqs)
    if kind == "autoregressive":
        return AutoregressiveSpeculator(head, config, caches)
    return EagleProposer(head, config, caches)


class Builders:
    VOCAB = VOCAB
    BLOCK_SIZE = BLOCK_SIZE
    BLOCK_KINDS = BLOCK_KINDS
    make_target = staticmethod(make_target)
    bigram_map = staticmethod(bigram_map)
    make_proposer = staticmethod(make_proposer)
    spec_config = staticmethod(spec_config)
    model_config = staticmethod(model_config)


@pytest.fixture(scope="session")
def build():
    return Builders
