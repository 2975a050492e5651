"""Load draft heads from a local Hugging Face-format folder (config.json plus
*.safetensors, or pytorch_model*.bin), in the layouts EAGLE heads are published in:

- EAGLE-1 (method "eagle"): fc.weight [H, 2H] (+ fc.bias), layers.0.* (or midlayer.*),
  optional layers.0.input_layernorm / norm / embed_tokens / lm_head;
- EAGLE-3 ("eagle3"): fc.weight [H, 3 * target_hidden], midlayer.* (with
  midlayer.hidden_norm), norm.weight, lm_head.weight [draft_vocab, H], d2t
  [draft_vocab] (target id = draft id + d2t[draft id]), t2d [vocab] bool (optional:
  derived from d2t when absent);
- MTP ("mtp"): layers.K.{enorm, hnorm, eh_proj, self_attn, mlp, shared_head.norm,
  shared_head.head?} (DeepSeek numbers MTP layers after the target's; they are
  renumbered from 0), embed_tokens / lm_head optional.

A leading "model." is ignored. Weights missing from the folder that the target can
supply (embed_tokens, lm_head) are recorded in `model.missing_weights`; the head
refuses to run until share_from(target) fills them. Any other missing, mis-shaped
or unexpected tensor is a ValueError naming it.

safetensors files are read and written with the `safetensors` package; a folder with
a model.safetensors.index.json is read through its weight_map (shards).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdraft.models.config import DraftModelConfig
from specdraft.models.heads import DraftHead, Eagle3Head, EagleHead, MTPHead

METHODS = ("eagle", "eagle3", "mtp")
SHAREABLE = ("embed_tokens.weight", "lm_head.weight")

# ---------------------------------------------------------------- safetensors I/O


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of one .safetensors file, on CPU."""
    return load_file(str(path))


def write_safetensors(
    path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write tensors to one .safetensors file. Tensors that share memory (tied
    weights) are written as separate copies: the format stores each name's bytes."""
    seen, out = set(), {}
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if t.numel() and ptr in seen:
            t = t.clone()
        seen.add(ptr)
        out[name] = t
    save_file(out, str(path), metadata=dict(metadata) if metadata else None)


def read_config(folder: str | Path) -> dict:
    """config.json of a local HF-format folder."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"folder: {folder} has no config.json")
    return json.loads((folder / "config.json").read_text())


def read_checkpoint(folder: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json dict, all tensors) of a local HF-format folder: the shards a
    model.safetensors.index.json names (every tensor it lists must be in its shard),
    else every *.safetensors file, else pytorch_model*.bin."""
    folder = Path(folder)
    hf = read_config(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return hf, _read_sharded(folder, json.loads(index.read_text()))
    files = sorted(folder.glob("*.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    if files:
        for f in files:
            tensors.update(read_safetensors(f))
    else:
        bins = sorted(folder.glob("pytorch_model*.bin"))
        if not bins:
            raise ValueError(f"folder: {folder} has no *.safetensors or pytorch_model*.bin files")
        for f in bins:
            tensors.update(torch.load(f, map_location="cpu", weights_only=True))
    return hf, tensors


def _read_sharded(folder: Path, index: dict) -> dict[str, torch.Tensor]:
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"model.safetensors.index.json in {folder} has no weight_map")
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if not (folder / shard).is_file():
            raise ValueError(f"model.safetensors.index.json names shard {shard!r}, which is not in {folder}")
        part = read_safetensors(folder / shard)
        for name, value in part.items():
            if weight_map.get(name) == shard:
                tensors[name] = value
    for name, shard in weight_map.items():
        if name not in tensors:
            raise ValueError(f"tensor {name!r} is missing from shard {shard!r} (model.safetensors.index.json)")
    return tensors


# ---------------------------------------------------------------- layouts


def detect_method(names: set[str], hf: dict | None = None) -> str:
    if "d2t" in names or any(n.startswith("midlayer.hidden_norm") for n in names):
        return "eagle3"
    if any(n.endswith(".enorm.weight") for n in names):
        return "mtp"
    if "fc.weight" in names:
        return "eagle"
    arch = " ".join((hf or {}).get("architectures", []))
    raise ValueError(f"method: cannot tell the head type from the tensor names (architectures: {arch or 'none'})")


def _strip_prefix(name: str) -> str:
    return name[len("model.") :] if name.startswith("model.") else name


def normalise_names(tensors: dict[str, torch.Tensor], method: str) -> dict[str, torch.Tensor]:
    """Checkpoint names -> this package's module names."""
    out = {_strip_prefix(k): v for k, v in tensors.items()}
    if method == "eagle":
        return {("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in out.items()}
    if method == "eagle3":
        return {("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v for k, v in out.items()}
    return _renumber_mtp(out)


_LAYER = re.compile(r"^layers\.(\d+)\.(.*)$")


def _renumber_mtp(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    ids = sorted({int(m.group(1)) for k in tensors if (m := _LAYER.match(k)) and m.group(2) == "enorm.weight"})
    new_id = {old: i for i, old in enumerate(ids)}
    out = {}
    for k, v in tensors.items():
        m = _LAYER.match(k)
        if m is None or int(m.group(1)) not in new_id:
            out[k] = v
        elif m.group(2) == "embed_tokens.weight":  # DeepSeek stores a copy per MTP layer
            out.setdefault("embed_tokens.weight", v)
        else:
            out[f"layers.{new_id[int(m.group(1))]}.{m.group(2)}"] = v
    return out


def build_head(method: str, config: DraftModelConfig, names: set[str]) -> DraftHead:
    """An uninitialised head whose optional parts match what the checkpoint has."""
    if method == "eagle":
        return EagleHead(
            config,
            fc_bias="fc.bias" in names,
            input_norm="layers.0.input_layernorm.weight" in names,
            final_norm="norm.weight" in names,
        )
    if method == "eagle3":
        return Eagle3Head(config)
    if method == "mtp":
        n_layers = len({k.split(".")[1] for k in names if k.startswith("layers.") and k.endswith(".enorm.weight")})
        if n_layers != config.n_predict:
            raise ValueError(
                f"n_predict: config.json gives {config.n_predict} but the checkpoint has {n_layers} MTP layers"
            )
        per_layer = any(k.endswith("shared_head.head.weight") for k in names)
        return MTPHead(config, per_layer_lm_head=per_layer)
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


# ---------------------------------------------------------------- loading


def load_draft_model(
    folder: str | Path,
    method: str | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    strict: bool = True,
) -> DraftHead:
    """Build and fill a draft head from `folder`. method: "eagle", "eagle3", "mtp" or
    None to detect from the tensor names. dtype overrides config.json's torch_dtype.
    strict: unexpected tensors are an error (a sign the layout was misread)."""
    hf, raw = read_checkpoint(folder)
    method = detect_method({_strip_prefix(k) for k in raw}, hf) if method is None else method
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    config = DraftModelConfig.from_hf_config(hf, dtype=dtype)
    tensors = normalise_names(raw, method)
    model = build_head(method, config, set(tensors))
    fill_state(model, tensors, strict=strict)
    return model.to(device) if device is not None else model


def copy_state(
    module: torch.nn.Module,
    tensors: dict[str, torch.Tensor],
    may_be_missing: Callable[[str], bool] = lambda name: False,
    strict: bool = True,
    checkpoint_name: Callable[[str], str] = lambda name: name,
) -> set[str]:
    """Copy checkpoint tensors into module.state_dict() by name (cast to each entry's
    dtype). A ValueError names a missing tensor (unless may_be_missing(name)), a
    mis-shaped one, and, when strict, unexpected ones, each by checkpoint_name(its
    module name). Returns the names left out."""
    expected = module.state_dict()
    left_out = set()
    for name, want in expected.items():
        if name not in tensors:
            if may_be_missing(name):
                left_out.add(name)
                continue
            raise ValueError(f"tensor {checkpoint_name(name)!r} is missing from the checkpoint")
        got = tensors[name]
        if tuple(got.shape) != tuple(want.shape):
            raise ValueError(
                f"tensor {checkpoint_name(name)!r} has shape {tuple(got.shape)} in the checkpoint, expected {tuple(want.shape)} "
                "from config.json"
            )
        with torch.no_grad():
            want.copy_(got.to(want.dtype) if not want.dtype.is_floating_point else got)
    unexpected = sorted(checkpoint_name(name) for name in set(tensors) - set(expected))
    if strict and unexpected:
        raise ValueError(
            f"unexpected tensors in the checkpoint: {', '.join(unexpected[:5])}"
            + (" ..." if len(unexpected) > 5 else "")
        )
    return left_out


def fill_state(model: DraftHead, tensors: dict[str, torch.Tensor], strict: bool = True) -> None:
    identity_map = model.config.draft_vocab_size == model.config.vocab_size

    def may_be_missing(name: str) -> bool:
        if name in SHAREABLE:  # the target can supply it (share_from)
            return not _needed_from_checkpoint(model, name)
        # No vocabulary map: the identity defaults stand. t2d is derived from d2t
        # below (vLLM does not read t2d either).
        return (name == "d2t" and identity_map) or name == "t2d"

    left_out = copy_state(model, tensors, may_be_missing, strict)
    if isinstance(model, Eagle3Head):
        _check_d2t(model)
        if "t2d" not in tensors and not identity_map:
            with torch.no_grad():
                model.t2d.zero_().index_fill_(0, model.draft_token_target_ids(), True)
    model.missing_weights = frozenset(name.split(".")[0] for name in left_out if name in SHAREABLE)


def _needed_from_checkpoint(model: DraftHead, name: str) -> bool:
    # EAGLE-3's lm_head covers the draft vocabulary: the target's cannot replace it.
    return name == "lm_head.weight" and isinstance(model, Eagle3Head)


def _check_d2t(model: Eagle3Head) -> None:
    """Load-time (host) check: every draft id must map into the target vocabulary."""
    ids = model.draft_token_target_ids()
    bad = (ids < 0) | (ids >= model.config.vocab_size)
    if bool(bad.any()):
        d = int(bad.to(torch.int64).argmax())
        raise ValueError(
            f"tensor 'd2t' maps draft id {d} to target id {int(ids[d])}, outside [0, {model.config.vocab_size})"
        )


def save_draft_model(model: DraftHead, folder: str | Path, shared: Iterable[str] = ()) -> None:
    """Write config.json and model.safetensors in the published layout of the head
    (EAGLE-1: layers.0.*, EAGLE-3: midlayer.*), leaving out weights it never had and
    the modules named in `shared` ("embed_tokens", "lm_head": taken from the target,
    so the loaded head gets them back through share_from(target))."""
    shared = set(shared)
    if not shared <= {s.split(".")[0] for s in SHAREABLE}:
        raise ValueError(
            f"shared: only {sorted(s.split('.')[0] for s in SHAREABLE)} can be left out, got {sorted(shared)}"
        )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf_config(), indent=2))
    leave_out = set(model.missing_weights) | shared
    state = {k: v for k, v in model.state_dict().items() if k.split(".")[0] not in leave_out}
    write_safetensors(folder / "model.safetensors", state)
