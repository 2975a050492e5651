"""Which files of a folder make up a checkpoint (index, shards, strays, duplicates),
the kind of each stored tensor, and the EAGLE-3 vocabulary-map rule. The oracle is
what each test wrote: a load either gives back exactly those tensors or names the
offending file / tensor."""

import json

import pytest
import torch

from specdraft.models import DraftModelConfig, TinyTargetModel, load_draft_model, load_target_model, write_safetensors

from fixtures.checkpoints import (
    DV,
    HF,
    INDEX,
    V,
    eagle3_checkpoint,
    rand,
    tiny_batch,
    write_folder,
    write_indexed_folder,
)


def assert_state_is(model, tensors):
    state = model.state_dict()
    for name, value in tensors.items():
        if name != "t2d":
            torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)


# ------------------------------------------------------------------ index and shards


def test_index_names_the_files_and_a_stray_consolidated_file_is_ignored(tmp_path):
    hf, t = eagle3_checkpoint()
    folder, _ = write_indexed_folder(tmp_path / "m", hf, t, shards=3)
    # Mistral-style folders carry consolidated.safetensors beside the HF shards: other
    # values under the same names, and names of its own. The index decides.
    stray = {name: torch.zeros_like(value) for name, value in t.items()} | {"layers.9.extra": rand(2)}
    write_safetensors(folder / "consolidated.safetensors", stray)
    assert_state_is(load_draft_model(folder), t)


def test_without_an_index_every_file_is_read(tmp_path):
    hf, t = eagle3_checkpoint()
    folder = write_folder(tmp_path / "m", hf, t, shards=3)  # model-00000 ... 00002, no index
    assert_state_is(load_draft_model(folder), t)


def test_a_tensor_in_two_files_names_both(tmp_path):
    hf, t = eagle3_checkpoint()
    folder = write_folder(tmp_path / "plain", hf, t)
    write_safetensors(folder / "consolidated.safetensors", {"fc.weight": rand(*t["fc.weight"].shape)})
    with pytest.raises(ValueError, match=r"'fc\.weight' is in two files, 'consolidated\.safetensors' and 'model-00000"):
        load_draft_model(folder)

    # Under an index too: both shards it names hold the tensor.
    folder, weight_map = write_indexed_folder(tmp_path / "sharded", hf, t, shards=2)
    first, second = sorted(set(weight_map.values()))
    name = next(n for n, s in weight_map.items() if s == first)
    write_safetensors(folder / second, {n: t[n] for n, s in weight_map.items() if s == second} | {name: t[name]})
    with pytest.raises(ValueError, match=f"'{name}' is in two files, '{first}' and '{second}'"):
        load_draft_model(folder)


def test_index_errors_name_the_tensor_or_shard(tmp_path):
    hf, t = eagle3_checkpoint()
    folder, weight_map = write_indexed_folder(tmp_path / "a", hf, t, shards=2)
    shard = weight_map["fc.weight"]
    del weight_map["fc.weight"]  # in its shard, but not listed
    (folder / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match=f"'fc.weight' is in a shard but {INDEX} does not list it"):
        load_draft_model(folder)
    weight_map["fc.weight"] = "model-00009-of-00009.safetensors"
    (folder / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match="names shard 'model-00009-of-00009.safetensors', which is not in"):
        load_draft_model(folder)
    weight_map["fc.weight"] = "../" + shard
    (folder / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match="which is not a file name"):
        load_draft_model(folder)
    (folder / INDEX).write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ValueError, match="no weight_map"):
        load_draft_model(folder)


def test_pytorch_bin_files_when_there_is_no_safetensors(tmp_path):
    hf, t = eagle3_checkpoint()
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf))
    names = sorted(t)
    torch.save({n: t[n] for n in names[::2]}, folder / "pytorch_model-00001-of-00002.bin")
    torch.save({n: t[n] for n in names[1::2]}, folder / "pytorch_model-00002-of-00002.bin")
    assert_state_is(load_draft_model(folder), t)
    torch.save({"fc.weight": t["fc.weight"]}, folder / "pytorch_model-00003-of-00002.bin")
    with pytest.raises(ValueError, match=r"'fc\.weight' is in two files"):
        load_draft_model(folder)


# ------------------------------------------------------------------ stored dtypes


@pytest.mark.parametrize(
    "name, stored, message",
    [
        ("fc.weight", lambda v: v.to(torch.int32), r"'fc\.weight' is stored as torch\.int32"),
        ("norm.weight", lambda v: v > 0, r"'norm\.weight' is stored as torch\.bool"),
        ("midlayer.mlp.up_proj.weight", lambda v: v.to(torch.int8), "stored as torch.int8"),
        ("lm_head.weight", lambda v: v.to(torch.float8_e4m3fn), "quantized"),
        ("d2t", lambda v: v.to(torch.float32), r"'d2t' is stored as torch\.float32; it holds ids"),
    ],
)
def test_weights_of_the_wrong_kind_are_refused_by_name(tmp_path, name, stored, message):
    hf, t = eagle3_checkpoint()
    with pytest.raises(ValueError, match=message):
        load_draft_model(write_folder(tmp_path / "m", hf, {**t, name: stored(t[name])}))


def test_half_precision_weights_and_integer_maps_load(tmp_path):
    """What the kind check must let through: bf16 / fp16 weights (cast to the
    config's dtype), d2t as int32, t2d as bool."""
    hf, t = eagle3_checkpoint()
    stored = {**t, "fc.weight": t["fc.weight"].to(torch.bfloat16), "norm.weight": t["norm.weight"].half()}
    stored["d2t"] = t["d2t"].to(torch.int32)
    model = load_draft_model(write_folder(tmp_path / "m", hf, stored))
    assert torch.equal(model.fc.weight, t["fc.weight"].to(torch.bfloat16).float())
    assert torch.equal(model.norm.weight, t["norm.weight"].half().float())
    assert torch.equal(model.d2t, t["d2t"])


def test_the_target_loader_refuses_integer_weights(tmp_path):
    target = TinyTargetModel(DraftModelConfig.from_hf_config({**HF, "num_hidden_layers": 1}))
    state = {("lm_head.weight" if k.startswith("lm_head") else "model." + k): v for k, v in target.state_dict().items()}
    state["model.norm.weight"] = state["model.norm.weight"].to(torch.int64)
    hf = {**HF, "model_type": "llama", "num_hidden_layers": 1}
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' is stored as torch\.int64"):
        load_target_model(write_folder(tmp_path / "t", hf, state))


# ------------------------------------------------------------------ the vocabulary map


def draft_paths_agree(model):
    """The two ways a proposer gets a target token from an EAGLE-3 head: argmax of
    compute_logits (target vocabulary), and map_draft_to_target of the argmax of the
    draft-vocabulary logits. They must name the same token."""
    ids, pos, md = tiny_batch()
    hidden, _ = model(ids, pos, torch.randn(5, 3 * model.config.target_hidden_size), md, model.allocate_kv_caches(2, 4))
    via_full = model.compute_logits(hidden).argmax(-1)
    via_draft = model.map_draft_to_target(model.compute_draft_logits(hidden).argmax(-1))
    return torch.equal(via_full, via_draft)


def full_vocab_checkpoint(d2t):
    hf, t = eagle3_checkpoint()
    t = {k: v for k, v in t.items() if k not in ("d2t", "t2d")} | {"lm_head.weight": rand(V, 16)}
    return {**hf, "draft_vocab_size": V}, t | ({} if d2t is None else {"d2t": d2t})


def test_equal_size_vocabulary_map_must_be_the_identity(tmp_path):
    # A permutation: before the rule the head loaded it and its two paths disagreed.
    permutation = torch.randperm(V, generator=torch.Generator().manual_seed(0))
    hf, t = full_vocab_checkpoint(permutation - torch.arange(V))
    with pytest.raises(
        ValueError, match=r"'d2t' maps draft id \d+ to target id \d+ but draft_vocab_size == vocab_size"
    ):
        load_draft_model(write_folder(tmp_path / "perm", hf, t))
    for name, d2t in (("zeros", torch.zeros(V, dtype=torch.int64)), ("absent", None)):
        hf, t = full_vocab_checkpoint(d2t)
        model = load_draft_model(write_folder(tmp_path / name, hf, t))
        model.share_from(TinyTargetModel(model.config))
        assert draft_paths_agree(model) and bool(model.t2d.all())


def test_smaller_draft_vocabulary_map_is_injective_and_the_paths_agree(tmp_path):
    hf, t = eagle3_checkpoint()  # draft id d -> target id 3d
    model = load_draft_model(write_folder(tmp_path / "ok", hf, t))
    model.share_from(TinyTargetModel(model.config))
    assert draft_paths_agree(model)
    assert model.t2d.nonzero().flatten().tolist() == [3 * d for d in range(DV)]
    # A wrong t2d in the folder does not matter: it is derived from d2t.
    wrong_t2d = load_draft_model(write_folder(tmp_path / "t2d", hf, {**t, "t2d": ~t["t2d"]}))
    assert torch.equal(wrong_t2d.t2d, model.t2d)
    clash = t["d2t"].clone()
    clash[1] = 6 - 1  # draft id 1 -> target id 6, draft id 2's
    with pytest.raises(ValueError, match="'d2t' maps 2 draft ids onto target id 6; the map must be injective"):
        load_draft_model(write_folder(tmp_path / "clash", hf, {**t, "d2t": clash}))


def test_the_shipped_demo_pair_loads_bit_for_bit():
    """Both demo checkpoints through the loaders equal the files as the safetensors
    package reads them (names mapped, nothing cast)."""
    from safetensors.torch import load_file

    from specdraft.assets import DEMO_PAIR

    raw = load_file(DEMO_PAIR / "eagle3" / "model.safetensors")
    head = load_draft_model(DEMO_PAIR / "eagle3")
    state = head.state_dict()
    assert raw.keys() <= state.keys()
    for name, value in raw.items():
        assert state[name].dtype == value.dtype and torch.equal(state[name], value), name
    raw = load_file(DEMO_PAIR / "target" / "model.safetensors")
    target = load_target_model(DEMO_PAIR / "target").state_dict()
    for name, value in raw.items():
        assert torch.equal(target[name.removeprefix("model.")], value), name
