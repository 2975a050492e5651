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

safetensors: the `safetensors` package is used when installed, else the small reader
below (the format: 8-byte little-endian header length, a JSON header of name ->
{dtype, shape, data_offsets}, then raw little-endian bytes).
"""

from __future__ import annotations

import ctypes
import json
import re
from pathlib import Path

import torch

from specdraft.models.config import DraftModelConfig
from specdraft.models.heads import DraftHead, Eagle3Head, EagleHead, MTPHead

_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
METHODS = ("eagle", "eagle3", "mtp")
SHAREABLE = ("embed_tokens.weight", "lm_head.weight")

# ---------------------------------------------------------------- safetensors I/O


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of one .safetensors file, on CPU."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        return _read_safetensors_plain(Path(path))
    return load_file(str(path))


def _read_safetensors_plain(path: Path) -> dict[str, torch.Tensor]:
    data = path.read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: too short to be a safetensors file")
    n = int.from_bytes(data[:8], "little")
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, info in header.items():
        if info["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        dtype, shape = _ST_DTYPES[info["dtype"]], tuple(info["shape"])
        start, end = info["data_offsets"]
        numel = 1
        for s in shape:
            numel *= s
        if end - start != numel * dtype.itemsize or base + end > len(data):
            raise ValueError(f"{path}: tensor {name!r} has {end - start} bytes, expected {numel * dtype.itemsize}")
        if numel == 0:
            out[name] = torch.zeros(shape, dtype=dtype)
            continue
        raw = bytearray(data[base + start : base + end])
        out[name] = torch.frombuffer(raw, dtype=dtype).reshape(shape)
    return out


def write_safetensors(
    path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write tensors in the safetensors format (dependency-free; readable by the
    `safetensors` package)."""
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in _ST_NAMES:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} cannot be written")
        size = t.numel() * t.element_size()
        blobs.append(ctypes.string_at(t.data_ptr(), size) if size else b"")
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)


def read_checkpoint(folder: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json dict, all tensors) of a local HF-format folder."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"folder: {folder} has no config.json")
    hf = json.loads((folder / "config.json").read_text())
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


def fill_state(model: DraftHead, tensors: dict[str, torch.Tensor], strict: bool = True) -> None:
    expected = model.state_dict()
    missing_shareable = set()
    for name, want in expected.items():
        if name not in tensors:
            if name in SHAREABLE and not _needed_from_checkpoint(model, name):
                missing_shareable.add(name.split(".")[0])
                continue
            if name in ("d2t", "t2d") and model.config.draft_vocab_size == model.config.vocab_size:
                continue  # no vocabulary map: the identity defaults stand
            if name == "t2d":
                continue  # derived from d2t below (vLLM does not read t2d either)
            raise ValueError(f"tensor {name!r} is missing from the checkpoint")
        got = tensors[name]
        if tuple(got.shape) != tuple(want.shape):
            raise ValueError(
                f"tensor {name!r} has shape {tuple(got.shape)} in the checkpoint, expected {tuple(want.shape)} "
                "from config.json"
            )
        with torch.no_grad():
            want.copy_(got.to(want.dtype) if not want.dtype.is_floating_point else got)
    unexpected = sorted(set(tensors) - set(expected))
    if strict and unexpected:
        raise ValueError(
            f"unexpected tensors in the checkpoint: {', '.join(unexpected[:5])}"
            + (" ..." if len(unexpected) > 5 else "")
        )
    if isinstance(model, Eagle3Head):
        _check_d2t(model)
        if "t2d" not in tensors and model.config.draft_vocab_size != model.config.vocab_size:
            with torch.no_grad():
                model.t2d.zero_().index_fill_(0, model.draft_token_target_ids(), True)
    model.missing_weights = frozenset(missing_shareable)


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


def save_draft_model(model: DraftHead, folder: str | Path) -> None:
    """Write config.json and model.safetensors in the published layout of the head
    (EAGLE-1: layers.0.*, EAGLE-3: midlayer.*), leaving out weights it never had."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf_config(), indent=2))
    state = {k: v for k, v in model.state_dict().items() if k.split(".")[0] not in model.missing_weights}
    write_safetensors(folder / "model.safetensors", state)
