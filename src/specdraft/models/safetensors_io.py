"""Reading a local Hugging Face-format folder: config.json and its tensors.

Tensors are read and written with the `safetensors` package. Which files make up
the checkpoint:

- with a model.safetensors.index.json, exactly the shards its weight_map names
  (any other *.safetensors beside them, e.g. a stray consolidated.safetensors, is
  not read); every tensor the index lists must be in its shard, and a shard may
  hold no tensor the index does not assign to it;
- without one, every *.safetensors file in the folder;
- without any, every pytorch_model*.bin file.

A tensor name present in two of the files read is a ValueError naming both files:
which copy a loader would keep depends on its read order.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

INDEX = "model.safetensors.index.json"


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


def strip_model_prefix(name: str) -> str:
    """A checkpoint tensor name without its leading "model." (HF's base-model prefix)."""
    return name[len("model.") :] if name.startswith("model.") else name


def read_config(folder: str | Path) -> dict:
    """config.json of a local HF-format folder."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"folder: {folder} has no config.json")
    return json.loads((folder / "config.json").read_text())


def read_checkpoint(folder: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json dict, all tensors) of a local HF-format folder (see the module
    docstring for which files are read)."""
    folder = Path(folder)
    hf = read_config(folder)
    if (folder / INDEX).is_file():
        return hf, read_sharded(folder, json.loads((folder / INDEX).read_text()))
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return hf, merge_files({f.name: read_safetensors(f) for f in files})
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not bins:
        raise ValueError(f"folder: {folder} has no *.safetensors or pytorch_model*.bin files")
    return hf, merge_files({f.name: torch.load(f, map_location="cpu", weights_only=True) for f in bins})


def merge_files(parts: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One dict of the tensors of several files (file name -> its tensors); a name
    found in two files is a ValueError naming the tensor and both files."""
    tensors: dict[str, torch.Tensor] = {}
    source: dict[str, str] = {}
    for file_name, part in parts.items():
        for name, value in part.items():
            if name in source:
                raise ValueError(
                    f"tensor {name!r} is in two files, {source[name]!r} and {file_name!r}: "
                    "which one is the model's is ambiguous"
                )
            tensors[name], source[name] = value, file_name
    return tensors


def read_sharded(folder: Path, index: dict) -> dict[str, torch.Tensor]:
    """The tensors of the shards a model.safetensors.index.json names."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{INDEX} in {folder} has no weight_map of tensor name -> shard file")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if Path(shard).name != shard:
            raise ValueError(f"{INDEX} names shard {shard!r}, which is not a file name in {folder}")
        if not (folder / shard).is_file():
            raise ValueError(f"{INDEX} names shard {shard!r}, which is not in {folder}")
    parts = {shard: read_safetensors(folder / shard) for shard in shards}
    for name, shard in weight_map.items():
        if name not in parts[shard]:
            raise ValueError(f"tensor {name!r} is missing from shard {shard!r} ({INDEX})")
    tensors = merge_files(parts)
    for name in tensors:
        if name not in weight_map:
            raise ValueError(f"tensor {name!r} is in a shard but {INDEX} does not list it")
    return tensors


def tensor_file(folder: str | Path, name: str) -> str | None:
    """The name of the file of `folder` that read_checkpoint reads tensor `name` (a
    checkpoint name, as stored) from, or None when none of those files holds it. For
    error messages: it reads only safetensors headers (and pytorch_model*.bin files
    in full, where those are the checkpoint)."""
    folder = Path(folder)
    if (folder / INDEX).is_file():
        weight_map = json.loads((folder / INDEX).read_text()).get("weight_map") or {}
        return weight_map.get(name)
    files = sorted(folder.glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            if name in reader.keys():  # noqa: SIM118 - a safetensors reader, not a dict
                return file.name
    if files:
        return None
    for file in sorted(folder.glob("pytorch_model*.bin")):
        if name in torch.load(file, map_location="cpu", weights_only=True):
            return file.name
    return None
