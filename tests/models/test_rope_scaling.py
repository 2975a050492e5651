"""Scaled RoPE (linear, YaRN, Llama 3; dynamic NTK refused) and Qwen3-VL's interleaved M-RoPE
against transformers: ROPE_INIT_FUNCTIONS for the inverse frequencies and attention
factor, LlamaRotaryEmbedding / Qwen3VLTextRotaryEmbedding + apply_rotary_pos_emb for
the rotated q and k; config.json in transformers 4's `rope_scaling` and transformers
5's `rope_parameters` spelling; refusals name the key."""

import pytest
import torch

from specdraft.models import DraftModelConfig, RotaryEmbedding
from specdraft.testing import CompileCounts, fresh_compile

transformers = pytest.importorskip(
    "transformers", minversion="5", reason="transformers >= 5 is the oracle (a test-only dependency: the test extra)"
)
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply  # noqa: E402
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig  # noqa: E402
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding  # noqa: E402
from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb as qwen3_vl_apply  # noqa: E402

HD, THETA, MAX_POS = 32, 10000.0, 16384
BASE = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": HD, "vocab_size": 50, "max_position_embeddings": MAX_POS}  # fmt: skip

# Each scaling as its rope dict (without rope_theta); original_max_position_embeddings
# is small so every variant bends frequencies that positions below 20k reach.
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 512},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    "yarn_mscale": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
                    "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0},
    "yarn_attention_factor_untruncated": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048,
                                          "attention_factor": 1.3, "truncate": False, "beta_fast": 16.0},
    "yarn_factor_from_lengths": {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 2048},
}  # fmt: skip


def spellings(rope: dict) -> dict[str, dict]:
    """The same RoPE in both config.json spellings (transformers 4 used "type")."""
    v4 = {k: v for k, v in rope.items() if k != "rope_type"} | {"type": rope["rope_type"]}
    return {
        "rope_scaling": {**BASE, "rope_theta": THETA, "rope_scaling": v4},
        "rope_parameters": {**BASE, "rope_parameters": {**rope, "rope_theta": THETA}},
    }


def hf_config(hf: dict) -> LlamaConfig:
    return LlamaConfig(**hf)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def ours(hf: dict) -> RotaryEmbedding:
    c = DraftModelConfig.from_hf_config(hf)
    return RotaryEmbedding(c.head_dim, c.rope_theta, c.mrope_section, c.rope_scaling, c.mrope_interleaved)


@pytest.mark.parametrize("spelling", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_inverse_frequencies_and_attention_factor_match_transformers(name, spelling):
    hf = spellings(SCALINGS[name])[spelling]
    want_inv, want_factor = ROPE_INIT_FUNCTIONS[SCALINGS[name]["rope_type"]](hf_config(hf))
    rope = ours(hf)
    torch.testing.assert_close(rope.inverse_frequencies(), want_inv, rtol=0, atol=0)
    assert rope.attention_factor == pytest.approx(want_factor, rel=1e-12)


def rotate_with_transformers(config, positions, q, k):
    """q, k: [T, heads, D]; positions [T] -> transformers' rotated q, k, same layout."""
    rotary = LlamaRotaryEmbedding(config)
    cos, sin = rotary(q, positions[None])
    rq, rk = llama_apply(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    return rq[0].transpose(0, 1), rk[0].transpose(0, 1)


# Positions up to 20k: far past every original_max_position_embeddings above.
POSITIONS = torch.tensor([0, 1, 7, 63, 511, 512, 2047, 4095, 4097, 8191, 8192, 12000, 16000, 16383, 19999])


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_rotation_matches_transformers(name):
    hf = spellings(SCALINGS[name])["rope_parameters"]
    positions = POSITIONS
    q, k = randn(len(positions), 3, HD, seed=1), randn(len(positions), 1, HD, seed=2)
    got = ours(hf)(positions, q, k)
    want = rotate_with_transformers(hf_config(hf), positions, q, k)
    plain = rotate_with_transformers(hf_config(BASE | {"rope_theta": THETA}), positions, q, k)
    for a, b, p in zip(got, want, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert (a - p).abs().max() > 1e-2  # the scaling is visible at these positions: no silent plain RoPE


@pytest.mark.parametrize("spelling", ["rope_scaling", "rope_parameters"])
def test_dynamic_ntk_is_refused_by_its_key(spelling):
    """Dynamic NTK is refused, not loaded as the plain rotation (which differed from
    transformers past max_position_embeddings: nothing loads silently different),
    in both spellings, for heads and targets, and as a RopeScaling built by hand."""
    from specdraft.models import DraftModelConfig
    from specdraft.models.rope import RopeScaling
    from specdraft.models.target_loading import target_config_from_hf

    hf = spellings({"rope_type": "dynamic", "factor": 4.0})[spelling]
    with pytest.raises(ValueError, match=f"^{spelling}: dynamic NTK RoPE is refused"):
        DraftModelConfig.from_hf_config(hf)
    with pytest.raises(ValueError, match=f"^{spelling}: dynamic NTK RoPE is refused"):
        target_config_from_hf({**hf, "model_type": "llama", "num_hidden_layers": 1})
    with pytest.raises(ValueError, match="^rope_type: dynamic NTK RoPE is refused"):
        RopeScaling("dynamic", factor=4.0)


@pytest.mark.parametrize(
    "section, scaling",
    [((8, 4, 4), None), ((6, 5, 5), None), ((10, 2, 4), SCALINGS["yarn"]), ((16, 0, 0), None)],
)
def test_interleaved_mrope_matches_qwen3_vl(section, scaling):
    rope_dict = {"rope_type": "default", **(scaling or {}), "mrope_section": list(section), "mrope_interleaved": True}
    hf = {**BASE, "rope_theta": THETA, "rope_scaling": rope_dict}
    cfg = Qwen3VLTextConfig(**{**BASE, "rope_parameters": {**rope_dict, "rope_theta": THETA}})
    t = 9
    positions = torch.randint(0, 20000, (3, t), generator=torch.Generator().manual_seed(5))
    q, k = randn(t, 2, HD, seed=6), randn(t, 1, HD, seed=7)
    got = ours(hf)(positions, q, k)
    cos, sin = Qwen3VLTextRotaryEmbedding(cfg)(q, positions[:, None, :])
    want = qwen3_vl_apply(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    if section[1] or section[2]:  # the contiguous Qwen2-VL layout is something else
        contiguous = RotaryEmbedding(HD, THETA, section, DraftModelConfig.from_hf_config(hf).rope_scaling)
        assert (contiguous(positions, q, k)[0] - got[0]).abs().max() > 1e-2


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_both_spellings_give_one_config_that_round_trips(name):
    v4, v5 = (DraftModelConfig.from_hf_config(hf) for hf in spellings(SCALINGS[name]).values())
    assert v4 == v5 and v4.rope_scaling is not None and v4.rope_theta == THETA
    assert DraftModelConfig.from_hf_config(v4.to_hf_config()) == v4


def test_qwen3_vl_config_reads_interleaved_and_round_trips():
    hf = {**BASE, "rope_scaling": {"rope_type": "default", "mrope_section": [8, 4, 4], "mrope_interleaved": True}}
    c = DraftModelConfig.from_hf_config(hf)
    assert c.mrope_interleaved and c.mrope_section == (8, 4, 4) and c.rope_scaling is None
    assert DraftModelConfig.from_hf_config(c.to_hf_config()) == c
    qwen2_vl = DraftModelConfig.from_hf_config({**BASE, "rope_scaling": {"type": "mrope", "mrope_section": [8, 4, 4]}})
    assert not qwen2_vl.mrope_interleaved


@pytest.mark.parametrize(
    "change, key",
    [
        ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 1.0}}, "rope_parameters"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "short_factor": [1.0]}}, "rope_scaling"),
        ({"rope_scaling": {"rope_type": "linear"}}, "rope_scaling"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}}, "rope_scaling"),
        (
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 4.0,
                    "high_freq_factor": 1.0,
                    "original_max_position_embeddings": 64,
                }
            },
            "rope_scaling",
        ),  # fmt: skip
        ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        (
            {
                "rope_scaling": {"type": "linear", "factor": 2.0},
                "rope_parameters": {"rope_type": "linear", "factor": 4.0},
            },
            "rope_scaling and rope_parameters",
        ),  # fmt: skip
        ({"rope_theta": 10.0, "rope_parameters": {"rope_type": "default", "rope_theta": 20.0}}, "rope_theta"),
        ({"rope_scaling": "llama3"}, "rope_scaling"),
        ({"rope_scaling": {"rope_type": "default", "mrope_interleaved": True}}, "mrope_interleaved"),
        ({"rope_scaling": {"mrope_section": [2, 7, 7], "mrope_interleaved": True}}, "mrope_section"),
    ],
)
def test_refused_rope_keys_name_themselves(change, key):
    with pytest.raises(ValueError, match=key):
        DraftModelConfig.from_hf_config({**BASE, **change})


def test_yarn_without_any_length_is_refused():
    hf = {k: v for k, v in BASE.items() if k != "max_position_embeddings"}
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        DraftModelConfig.from_hf_config({**hf, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})


def test_original_max_position_embeddings_defaults_like_transformers():
    """Missing from the dict: max_position_embeddings; at the top level (Phi-3): it wins."""
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    for extra in ({}, {"original_max_position_embeddings": 256}):
        hf = {**BASE, **extra, "rope_theta": THETA, "rope_scaling": {**rope, "original_max_position_embeddings": 64}}
        if not extra:
            hf["rope_scaling"].pop("original_max_position_embeddings")
        want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config(hf))
        torch.testing.assert_close(ours(hf).inverse_frequencies(), want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["plain", *sorted(SCALINGS)])
def test_dynamic_compile_traces_once(name):
    """torch.compile(dynamic=True) traces RoPE's float attributes (theta, the scaling
    factors, the attention factor) as symbols. Each must stay one (tensorified) or be
    read only at construction: a float the trace pins to its value makes Dynamo
    throw the trace away and start again, which doubles a dynamic propose's cold
    compile. One trace, no recompile for a second length, equal to eager."""
    hf = BASE | {"rope_theta": THETA} if name == "plain" else spellings(SCALINGS[name])["rope_parameters"]
    rope = ours(hf)
    compiled = fresh_compile(rope, fullgraph=True, dynamic=True, backend="aot_eager")
    with CompileCounts.measure() as counts:
        for length in (5, 11):
            positions = POSITIONS[:length]
            q, k = randn(length, 3, HD, seed=1), randn(length, 1, HD, seed=2)
            for got, want in zip(compiled(positions, q, k), rope(positions, q, k), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert (counts.compiles, counts.restarts, counts.graph_breaks) == (1, 0, 0), counts
