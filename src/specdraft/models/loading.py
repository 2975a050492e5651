"""Load draft heads from a local Hugging Face-format folder (config.json plus
*.safetensors, or pytorch_model*.bin; which files, see specdraft.models.safetensors_io),
in the layouts EAGLE heads are published in:

- EAGLE-1 (method "eagle"): fc.weight [H, 2H] (+ fc.bias), layers.0.* (or midlayer.*),
  optional layers.0.input_layernorm / norm / embed_tokens / lm_head;
- EAGLE-3 ("eagle3"): fc.weight [H, 3 * target_hidden], midlayer.* (or layers.0.*,
  with midlayer.hidden_norm), norm.weight, lm_head.weight [draft_vocab, H], d2t
  [draft_vocab] (target id = draft id + d2t[draft id]), t2d [vocab] bool (optional;
  always derived from d2t); config.json in the HF form or the speculators form
  (translated by specdraft.models.formats);
- MTP ("mtp"): layers.K.{enorm, hnorm, eh_proj, self_attn, mlp, shared_head.norm,
  shared_head.head?} (DeepSeek numbers MTP layers after the target's; they are
  renumbered from 0), embed_tokens / lm_head optional; the other MTP layouts are
  mapped or refused in specdraft.models.mtp_layouts;
- block drafters ("block": DFlash, DSpark), told by config.json's architectures
  (DeepSpec's Qwen3DSparkModel / Gemma4DSparkModel and their kin): read by
  specdraft.models.block_loading (config.json: block_config, which also refuses the
  z-lab DFlash layout by name).

A leading "model." is ignored. Weights missing from the folder that the target can
supply (embed_tokens, lm_head) are recorded in `model.missing_weights`; the head
refuses to run until share_from(target) fills them. Any other missing, mis-shaped or
unexpected tensor is a ValueError naming it, and so is a weight stored as integers,
booleans or float8 (a checkpoint that was misread or quantized, never a weight to
cast). In checked mode (specdraft.checked_mode) a NaN or Inf in a loaded weight is
one too, named with its file (check_weights_finite: it reads every weight, so only
there).

The vocabulary map d2t must be injective (two draft ids on one target id would make
compute_logits drop one of them) and, when draft_vocab_size == vocab_size, the
identity: readers disagree on an equal-size map (vLLM applies it, the speculators
library ignores it), and so do Eagle3Head's two paths (compute_logits returns
equal-size draft logits unmapped, map_draft_to_target applies d2t).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from specdraft.checked_mode import is_checked
from specdraft.models.config import DraftModelConfig
from specdraft.models.formats import (
    check_layer_count,
    check_unsupported_keys,
    drop_training_only,
    expected_fields,
    is_speculators_config,
    to_hf_draft_config,
)
from specdraft.models.heads import DraftHead, Eagle3Head, EagleHead, MTPHead
from specdraft.models.mtp_layouts import config_updates, looks_like_mtp, normalise_mtp
from specdraft.models.safetensors_io import (
    read_checkpoint,
    read_config,
    read_safetensors,
    strip_model_prefix,
    tensor_file,
    write_safetensors,
)
from specdraft.value_checks import check_weight_finite

__all__ = [
    "METHODS",
    "build_head",
    "check_weights_finite",
    "copy_state",
    "detect_method",
    "fill_state",
    "load_draft_model",
    "normalise_names",
    "read_checkpoint",
    "read_config",
    "read_safetensors",
    "save_draft_model",
    "write_safetensors",
]

METHODS = ("eagle", "eagle3", "mtp", "block")
SHAREABLE = ("embed_tokens.weight", "lm_head.weight")

# ---------------------------------------------------------------- layouts


def detect_method(names: set[str], hf: dict | None = None) -> str:
    """The head type of (prefix-stripped) tensor names."""
    hf = hf or {}
    from specdraft.models.block_config import is_block_config  # noqa: PLC0415  (it builds on this module)

    if is_block_config(hf):
        return "block"
    if hf.get("speculators_model_type") == "eagle3":
        return "eagle3"
    if "d2t" in names or any(n.startswith(("midlayer.hidden_norm", "layers.0.hidden_norm")) for n in names):
        return "eagle3"
    if looks_like_mtp(names):
        return "mtp"
    if "fc.weight" in names:
        return "eagle"
    arch = " ".join(hf.get("architectures", []))
    raise ValueError(f"method: cannot tell the head type from the tensor names (architectures: {arch or 'none'})")


def normalise_names(tensors: dict[str, torch.Tensor], method: str, hf: dict | None = None) -> dict[str, torch.Tensor]:
    """Checkpoint names -> this package's module names."""
    out = {strip_model_prefix(k): v for k, v in tensors.items()}
    if method == "eagle":
        return {("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in out.items()}
    if method == "eagle3":
        out = drop_training_only(out) if is_speculators_config(hf or {}) else out
        return {("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v for k, v in out.items()}
    return normalise_mtp(out, hf or {})


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
    """Build and fill a draft head from `folder`. method: "eagle", "eagle3", "mtp",
    "block" or None to detect from config.json's architectures and the tensor names
    ("block": specdraft.models.block_loading.load_block_drafter's reading). dtype overrides config.json's torch_dtype.
    strict: unexpected tensors are an error (a sign the layout was misread).

    Names, shapes, dtypes and config keys are checked always. Checked mode
    (specdraft.checked_mode) also reads every floating weight loaded and refuses a
    NaN or Inf by tensor and file (check_weights_finite); unchecked, the values are
    loaded as they are."""
    source, raw = read_checkpoint(folder)
    names = {strip_model_prefix(k) for k in raw}
    method = detect_method(names, source) if method is None else method
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "block":
        from specdraft.models.block_loading import load_block_checkpoint  # noqa: PLC0415

        return load_block_checkpoint(folder, source, raw, dtype, device, strict=strict)
    tensors = normalise_names(raw, method, source)
    updates, expected = config_updates(names) if method == "mtp" else ({}, {})
    hf = {**to_hf_draft_config(source), **updates}
    check_unsupported_keys(hf)
    check_layer_count(hf, method)
    config = DraftModelConfig.from_hf_config(hf, dtype=dtype)
    check_fields(config, {**expected_fields(source), **expected})
    model = build_head(method, config, set(tensors))
    fill_state(model, tensors, strict=strict)
    if is_checked():
        check_weights_finite(model, tensors, raw, folder)
    return model.to(device) if device is not None else model


def check_fields(config: DraftModelConfig, expected: dict[str, tuple[str, object]]) -> None:
    """A ValueError naming the config.json key (or layout) whose setting the built
    config does not carry out: a variant this version's heads do not compute."""
    for name, (key, want) in expected.items():
        if getattr(config, name, None) != want:
            raise ValueError(f"{key}: {want!r} for {name} is not supported by this version's draft heads")


def copy_state(
    module: torch.nn.Module,
    tensors: dict[str, torch.Tensor],
    may_be_missing: Callable[[str], bool] = lambda name: False,
    strict: bool = True,
    checkpoint_name: Callable[[str], str] = lambda name: name,
) -> set[str]:
    """Copy checkpoint tensors into module.state_dict() by name (cast to each entry's
    dtype). A ValueError names a missing tensor (unless may_be_missing(name)), a
    mis-shaped one, one whose kind is wrong (integers or booleans for a floating
    weight, floats for an integer buffer such as d2t), and, when strict, unexpected
    ones, each by checkpoint_name(its module name). Returns the names left out."""
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
        check_kind(checkpoint_name(name), got.dtype, want.dtype)
        with torch.no_grad():
            want.copy_(got)
    unexpected = sorted(checkpoint_name(name) for name in set(tensors) - set(expected))
    if strict and unexpected:
        raise ValueError(
            f"unexpected tensors in the checkpoint: {', '.join(unexpected[:5])}"
            + (" ..." if len(unexpected) > 5 else "")
        )
    return left_out


def check_weights_finite(
    module: torch.nn.Module,
    tensors: dict[str, torch.Tensor],
    raw: dict[str, torch.Tensor],
    folder: str | Path,
    checkpoint_name: Callable[[str], str] = lambda name: name,
) -> None:
    """Checked mode's value check of a load: every floating tensor of
    module.state_dict() that was copied from `tensors` (module name -> tensor, the
    checkpoint's `raw` tensors renamed) is finite in the module's dtype. A ValueError
    names the tensor as the checkpoint stores it and the file of `folder` it is in,
    counts the NaN and Inf and gives the first one's flat index; a tensor that is
    finite as stored and not after the cast to the module's dtype is reported as an
    overflow of that dtype. Weights the checkpoint does not supply (left for
    share_from) are not read. It reads every weight: development only."""
    stored_as = {id(value): key for key, value in raw.items()}  # renaming keeps the tensor objects
    for name, loaded in module.state_dict().items():
        stored = tensors.get(name)
        if stored is None or not loaded.is_floating_point() or bool(torch.isfinite(loaded).all()):
            continue
        # A tensor the loader assembled (MiMo's input_proj, its column blocks
        # swapped) has no stored name: it is named as the module calls it.
        key = stored_as.get(id(stored))
        file = tensor_file(folder, key) if key is not None else None
        label = f"tensor {key or checkpoint_name(name)!r}" + (f" in {file!r}" if file else "")
        check_weight_finite(label, stored)
        overflow = (
            f" after the cast from {stored.dtype} to {loaded.dtype}; finite as stored, it overflows {loaded.dtype}"
        )
        check_weight_finite(label, loaded, overflow)


def check_kind(name: str, got: torch.dtype, want: torch.dtype) -> None:
    if want.is_floating_point:
        if not got.is_floating_point:
            raise ValueError(f"tensor {name!r} is stored as {got}; a weight must be a floating-point tensor")
        if got.itemsize == 1:  # float8: meaningless without the quantization scales it was stored with
            raise ValueError(f"tensor {name!r} is stored as {got} (quantized); quantized weights are not supported")
    elif got.is_floating_point or got.is_complex:
        raise ValueError(f"tensor {name!r} is stored as {got}; it holds ids and must be an integer or bool tensor")


def fill_state(model: DraftHead, tensors: dict[str, torch.Tensor], strict: bool = True) -> None:
    identity_map = model.config.draft_vocab_size == model.config.vocab_size

    def may_be_missing(name: str) -> bool:
        if name in SHAREABLE:  # the target can supply it (share_from)
            return not _needed_from_checkpoint(model, name)
        # No vocabulary map: the identity defaults stand.
        return (name == "d2t" and identity_map) or name == "t2d"

    left_out = copy_state(model, tensors, may_be_missing, strict)
    if isinstance(model, Eagle3Head):
        check_vocab_map(model)
        # t2d only restates d2t (nothing here computes with it; vLLM does not read
        # it): it is always derived, whatever the folder holds.
        with torch.no_grad():
            model.t2d.zero_().index_fill_(0, model.draft_token_target_ids(), True)
    model.missing_weights = frozenset(name.split(".")[0] for name in left_out if name in SHAREABLE)


def _needed_from_checkpoint(model: DraftHead, name: str) -> bool:
    # EAGLE-3's lm_head covers the draft vocabulary: the target's cannot replace it.
    return name == "lm_head.weight" and isinstance(model, Eagle3Head)


def check_vocab_map(model: Eagle3Head) -> None:
    """Load-time (host) checks of d2t: every draft id maps into the target
    vocabulary, no two onto one target id, and an equal-size map is the identity."""
    ids = model.draft_token_target_ids()
    vocab = model.config.vocab_size
    bad = (ids < 0) | (ids >= vocab)
    if bool(bad.any()):
        d = int(bad.to(torch.int64).argmax())
        raise ValueError(f"tensor 'd2t' maps draft id {d} to target id {int(ids[d])}, outside [0, {vocab})")
    if model.config.draft_vocab_size == vocab and bool(model.d2t.any()):
        d = int((model.d2t != 0).to(torch.int64).argmax())
        raise ValueError(
            f"tensor 'd2t' maps draft id {d} to target id {int(ids[d])} but draft_vocab_size == vocab_size "
            f"({vocab}): an equal-size vocabulary map must be the identity (readers disagree on any other)"
        )
    counts = torch.bincount(ids, minlength=vocab)
    if bool((counts > 1).any()):
        t = int((counts > 1).to(torch.int64).argmax())
        raise ValueError(f"tensor 'd2t' maps {int(counts[t])} draft ids onto target id {t}; the map must be injective")


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
