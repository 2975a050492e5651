"""Checked mode of the loaders: load_draft_model and load_target_model refuse a NaN or
Inf weight by its stored key and file, unchecked mode loads it as stored, and a clean
folder loads identically in both. The oracle is what each test wrote: the poisoned
entries (so the NaN / Inf counts and the first flat index), the file each key went
to (read back from the files on disk), and the clean tensors."""

import json

import pytest
import torch

import specdraft
from specdraft.models import DraftModelConfig, TinyTargetModel, load_draft_model, load_target_model, read_safetensors

from fixtures.checkpoints import HF, H, V, eagle3_checkpoint, rand, write_folder, write_indexed_folder

TARGET_HF = {**HF, "model_type": "llama", "num_hidden_layers": 2}


def draft_tensors():
    """EAGLE-3 under its layers.0.* names (stored names differ from the module's
    midlayer.*), with embed_tokens so that no weight is left for share_from."""
    hf, t = eagle3_checkpoint()
    t = {k.replace("midlayer.", "layers.0."): v for k, v in t.items()}
    return hf, t | {"embed_tokens.weight": rand(V, H)}


def target_tensors():
    model = TinyTargetModel(DraftModelConfig.from_hf_config(TARGET_HF))
    names = model.state_dict()
    return {("lm_head.weight" if k.startswith("lm_head") else "model." + k): rand(*v.shape) for k, v in names.items()}


def poison(tensors, key, flat_indices, value):
    bad = tensors[key].clone()
    bad.view(-1)[torch.tensor(flat_indices)] = torch.tensor(value)
    return {**tensors, key: bad}


def file_holding(folder, key):
    """The file a test wrote `key` to, read back from the folder itself."""
    (file,) = [f.name for f in folder.glob("*.safetensors") if key in read_safetensors(f)]
    return file


def write(layout, path, hf, tensors):
    """A folder in one of the layouts the loaders read; returns (folder, file of each key)."""
    if layout == "indexed":
        folder, weight_map = write_indexed_folder(path, hf, tensors, shards=2)
        return folder, weight_map.get
    if layout == "bin":
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps(hf))
        torch.save(tensors, path / "pytorch_model.bin")
        return path, lambda key: "pytorch_model.bin"
    folder = write_folder(path, hf, tensors, shards=3)
    return folder, lambda key: file_holding(folder, key)


def assert_states_equal(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        torch.testing.assert_close(sa[name], sb[name], rtol=0, atol=0, equal_nan=True, msg=name)


def load_both(load, folder, **kwargs):
    with specdraft.checked(False):
        unchecked = load(folder, **kwargs)
    with specdraft.checked():
        return unchecked, load(folder, **kwargs)


# ------------------------------------------------------------------ refused when checked


@pytest.mark.parametrize("layout", ["indexed", "shards", "bin"])
def test_a_nan_draft_weight_is_named_with_its_file(tmp_path, layout):
    hf, t = draft_tensors()
    key = "layers.0.mlp.up_proj.weight"
    bad = poison(t, key, [5, 9, 30], float("nan"))
    folder, file_of = write(layout, tmp_path / "d", hf, bad)
    with specdraft.checked(), pytest.raises(ValueError) as error:
        load_draft_model(folder)
    message = str(error.value)
    assert f"tensor '{key}' in '{file_of(key)}'" in message
    assert "must be finite, found 3 NaN and 0 Inf" in message and "flat index 5: nan" in message

    # Unchecked: loaded as stored, NaNs included.
    with specdraft.checked(False):
        model = load_draft_model(folder)
    torch.testing.assert_close(model.midlayer.mlp.up_proj.weight, bad[key], rtol=0, atol=0, equal_nan=True)


def test_an_inf_draft_weight_is_named_with_its_file(tmp_path):
    hf, t = draft_tensors()
    bad = poison(poison(t, "fc.weight", [7], float("inf")), "fc.weight", [40], float("-inf"))
    folder, weight_map = write_indexed_folder(tmp_path / "d", hf, bad, shards=2)
    with specdraft.checked(), pytest.raises(ValueError, match=r"found 0 NaN and 2 Inf .*flat index 7: inf") as error:
        load_draft_model(folder)
    assert f"tensor 'fc.weight' in '{weight_map['fc.weight']}'" in str(error.value)
    with specdraft.checked(False):
        torch.testing.assert_close(load_draft_model(folder).fc.weight, bad["fc.weight"], rtol=0, atol=0)


@pytest.mark.parametrize("value, counts", [(float("nan"), "2 NaN and 0 Inf"), (float("-inf"), "0 NaN and 2 Inf")])
@pytest.mark.parametrize("key", ["model.layers.1.self_attn.k_proj.weight", "lm_head.weight"])
def test_a_non_finite_target_weight_is_named_with_its_file(tmp_path, key, value, counts):
    t = target_tensors()
    bad = poison(t, key, [11, 12], value)
    folder, weight_map = write_indexed_folder(tmp_path / "t", TARGET_HF, bad, shards=3)
    with specdraft.checked(), pytest.raises(ValueError) as error:
        load_target_model(folder)
    message = str(error.value)
    assert f"tensor '{key}' in '{weight_map[key]}' must be finite, found {counts}" in message
    assert f"flat index 11: {value}" in message
    with specdraft.checked(False):
        state = load_target_model(folder).state_dict()
    module_name = key.removeprefix("model.")
    torch.testing.assert_close(state[module_name], bad[key], rtol=0, atol=0, equal_nan=True)


def test_a_weight_that_overflows_the_requested_dtype_is_named(tmp_path):
    """Finite as stored (float32), past float16's largest value (65504): the cast to
    dtype=float16 makes it Inf."""
    t = target_tensors()
    bad = poison(t, "model.norm.weight", [3], 1e6)
    folder = write_folder(tmp_path / "t", TARGET_HF, bad)
    with specdraft.checked(), pytest.raises(ValueError) as error:
        load_target_model(folder, dtype=torch.float16)
    message = str(error.value)
    assert "tensor 'model.norm.weight' in 'model-00000.safetensors' must be finite, found 0 NaN and 1 Inf" in message
    assert "flat index 3: inf) after the cast from torch.float32 to torch.float16" in message
    with specdraft.checked(False):
        assert load_target_model(folder, dtype=torch.float16).norm.weight[3].item() == float("inf")
    with specdraft.checked():  # in float32 it is finite, and loads
        assert load_target_model(folder).norm.weight[3].item() == 1e6


# ------------------------------------------------------------------ clean folders


def test_a_clean_draft_folder_loads_identically_in_both_modes(tmp_path):
    hf, t = draft_tensors()
    folder, _ = write_indexed_folder(tmp_path / "d", hf, t, shards=2)
    unchecked, checked = load_both(load_draft_model, folder)
    assert not checked.missing_weights
    assert_states_equal(unchecked, checked)
    stored = {k.replace("layers.0.", "midlayer."): v for k, v in t.items()}
    for name, value in checked.state_dict().items():
        if name != "t2d":  # derived from d2t
            torch.testing.assert_close(value, stored[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("tied", [False, True])
def test_a_clean_target_folder_loads_identically_in_both_modes(tmp_path, tied):
    t = target_tensors()
    hf = TARGET_HF
    if tied:  # lm_head left out: the embedding is read once
        hf = {**TARGET_HF, "tie_word_embeddings": True}
        t = {k: v for k, v in t.items() if k != "lm_head.weight"}
    folder, _ = write_indexed_folder(tmp_path / "t", hf, t, shards=2)
    unchecked, checked = load_both(load_target_model, folder)
    assert_states_equal(unchecked, checked)
    for name, value in checked.state_dict().items():
        key = name if name.startswith("lm_head") else "model." + name
        if tied and name == "lm_head.weight":
            key = "model.embed_tokens.weight"
        torch.testing.assert_close(value, t[key], rtol=0, atol=0, msg=name)


def test_a_tied_target_with_nan_in_both_copies_is_not_called_different(tmp_path):
    """tie_word_embeddings with lm_head stored too, the same NaN in both: the copies
    are compared bit for bit (NaN != NaN made them "differ"). Unchecked loads them as
    stored; checked mode refuses the NaN by name."""
    t = target_tensors()
    t["model.embed_tokens.weight"][3, 1] = float("nan")
    t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
    folder, _ = write_indexed_folder(tmp_path / "t", {**TARGET_HF, "tie_word_embeddings": True}, t, shards=2)
    model = load_target_model(folder)
    assert torch.isnan(model.lm_head.weight[3, 1])
    with specdraft.checked(), pytest.raises(ValueError, match="embed_tokens.weight.*must be finite"):
        load_target_model(folder)
    t["lm_head.weight"][0, 0] += 1.0  # a real difference is still one
    folder, _ = write_indexed_folder(tmp_path / "u", {**TARGET_HF, "tie_word_embeddings": True}, t, shards=2)
    with pytest.raises(ValueError, match="differs"):
        load_target_model(folder)
