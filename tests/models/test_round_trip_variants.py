"""Every head config the library can build round-trips: save_draft_model, then
load_draft_model, gives the same class, config, weights and outputs (issue 27). A
config a head cannot represent is refused when the head is built, not saved in a
form its loader then refuses (an EAGLE-3 head from a config with num_layers 4 wrote
num_hidden_layers 4)."""

import dataclasses

import pytest
import torch

from specdraft.models import DraftModelConfig, Eagle3Head, EagleHead, MTPHead, load_draft_model, save_draft_model

from fixtures.checkpoints import tiny_batch

H, V, DV = 32, 64, 24
BASE = DraftModelConfig(hidden_size=H, intermediate_size=48, num_heads=4, num_kv_heads=2, vocab_size=V,
                        target_hidden_size=H)  # fmt: skip


def config(**changes) -> DraftModelConfig:
    return dataclasses.replace(BASE, **changes)


VARIANTS = {
    "eagle": lambda: EagleHead(config()),
    "eagle fc bias, input norm": lambda: EagleHead(config(), fc_bias=True, input_norm=True),
    "eagle no final norm": lambda: EagleHead(config(), final_norm=False),
    "eagle normed feed": lambda: EagleHead(config(hidden_feed="normed")),
    "eagle qk norm, biases": lambda: EagleHead(config(qk_norm=True, attention_bias=True, o_proj_bias=True)),
    "eagle3": lambda: Eagle3Head(config(draft_vocab_size=DV)),
    "eagle3 same vocab": lambda: Eagle3Head(config(draft_vocab_size=V)),
    "eagle3 fc_norm": lambda: Eagle3Head(config(draft_vocab_size=DV, fc_norm=True)),
    "eagle3 norm_before_fc": lambda: Eagle3Head(config(draft_vocab_size=DV, norm_before_fc=True)),
    "eagle3 norm_before_residual": lambda: Eagle3Head(config(draft_vocab_size=DV, norm_before_residual=True)),
    "eagle3 no logits norm": lambda: Eagle3Head(config(draft_vocab_size=DV, logits_norm=False)),
    "eagle3 normed feed": lambda: Eagle3Head(config(draft_vocab_size=DV, hidden_feed="normed")),
    "mtp": lambda: MTPHead(config()),
    "mtp 3 layers": lambda: MTPHead(config(n_predict=3)),
    "mtp per-layer heads": lambda: MTPHead(config(n_predict=2), per_layer_lm_head=True),
    "mtp normed feed": lambda: MTPHead(config(n_predict=2, hidden_feed="normed")),
    "mtp of a 4-layer target": lambda: MTPHead(config(num_layers=4)),
}


def randomised(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    if isinstance(model, Eagle3Head) and model.config.draft_vocab_size != V:
        model.d2t.copy_(torch.arange(DV))  # draft id i is target id 2 i
        model.t2d.zero_().index_fill_(0, model.draft_token_target_ids(), True)
    return model


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_save_then_load_is_the_same_head(tmp_path, variant):
    model = randomised(VARIANTS[variant]())
    save_draft_model(model, tmp_path / "head")
    back = load_draft_model(tmp_path / "head")
    assert type(back) is type(model) and back.config == model.config
    want, got = model.state_dict(), back.state_dict()
    assert list(got) == list(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    ids, pos, md = tiny_batch()
    hidden = torch.randn(ids.shape[0], model.hidden_width)
    for step in range(model.num_kv_layers):
        a = model(ids, pos, hidden, md, model.allocate_kv_caches(2, 4), step)[0]
        b = back(ids, pos, hidden, md, back.allocate_kv_caches(2, 4), step)[0]
        assert torch.equal(model.compute_logits(a, step), back.compute_logits(b, step)), step


@pytest.mark.parametrize("head", [EagleHead, Eagle3Head])
def test_a_deeper_eagle_config_is_refused_when_built(head):
    with pytest.raises(ValueError, match="^num_layers"):
        head(config(num_layers=4, draft_vocab_size=DV))
