"""Checks of generate's inputs, all on the host before the first iteration: each
raises a ValueError naming the argument. Nothing here runs inside an iteration."""

import math
from collections.abc import Sequence

import torch

from specdraft.config import SamplingParams
from specdraft.value_checks import first_bad


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_target(target) -> None:
    config = getattr(target, "config", None)
    for field in ("vocab_size", "hidden_size", "num_layers"):
        if not isinstance(getattr(config, field, None), int):
            raise ValueError(f"target must have a config with an int {field} (e.g. a TinyTargetModel)")
    for method in ("compute_logits", "allocate_kv_caches"):
        if not callable(getattr(target, method, None)):
            raise ValueError(f"target must have a {method} method (e.g. a TinyTargetModel)")
    if getattr(config, "mrope_section", None) is not None:
        raise ValueError("target: M-RoPE targets are not supported by generate (text positions only)")


def check_proposer(proposer, target, aux_layers: tuple[int, ...], feeds_aux: bool) -> None:
    """The draft fits the target: vocabulary, hidden widths, cache block size."""
    k = getattr(proposer, "num_speculative_tokens", None)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"proposer: num_speculative_tokens (K) must be an int >= 1, got {k!r}")
    head = proposer.model
    vocab, target_vocab = head.config.vocab_size, target.config.vocab_size
    if vocab != target_vocab:
        raise ValueError(
            f"proposer: the draft's vocab_size ({vocab}) differs from the target's ({target_vocab}); "
            "draft logits must be over the target vocabulary"
        )
    block_size = proposer.config.block_size
    for i, cache in enumerate(proposer.kv_caches):
        if cache.dim() != 5 or cache.shape[2] != block_size:
            raise ValueError(
                f"proposer.kv_caches[{i}]: block size {tuple(cache.shape)[2:3]} differs from "
                f"config.block_size {block_size}"
            )
    if not proposer.reads_hidden:
        return  # a standalone LM
    target_hidden = target.config.hidden_size
    if feeds_aux:
        want = head.hidden_width
        if len(aux_layers) * target_hidden != want:
            raise ValueError(
                f"aux_layers: the head reads {want} features ({head.hidden_width_note}, target_hidden_size "
                f"{head.config.target_hidden_size}); {len(aux_layers)} aux layers of the target give "
                f"{len(aux_layers) * target_hidden}"
            )
    elif head.config.hidden_size != target_hidden:
        raise ValueError(
            f"proposer: the head's hidden_size ({head.config.hidden_size}) differs from the target's "
            f"({target_hidden}); EAGLE-1 and MTP read the target's final hidden state"
        )


def check_aux_layers(aux_layers, num_layers: int) -> tuple[int, ...]:
    layers = tuple(aux_layers)
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers:
            raise ValueError(f"aux_layers: layer {i!r} is not an int in [0, {num_layers})")
    return layers


def as_prompts(prompts, vocab_size: int, max_model_len: int) -> list[torch.Tensor]:
    """Each prompt a 1-D int64 CPU tensor of 1 .. max_model_len - 1 tokens in [0, V)."""
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token id sequences (lists or 1-D tensors)")
    out = []
    for b, prompt in enumerate(prompts):
        p = torch.as_tensor(prompt)
        if p.numel() == 0:
            raise ValueError(f"prompts[{b}] is empty: every prompt needs at least one token")
        if p.dim() != 1 or p.is_floating_point() or p.is_complex() or p.dtype == torch.bool:
            raise ValueError(
                f"prompts[{b}] must be a 1-D sequence of int token ids, got {p.dtype} of shape {tuple(p.shape)}"
            )
        if p.shape[0] >= max_model_len:
            raise ValueError(
                f"prompts[{b}] has {p.shape[0]} tokens; max_model_len {max_model_len} leaves no room to generate"
            )
        p = p.to(device="cpu", dtype=torch.int64)
        if int(p.min()) < 0 or int(p.max()) >= vocab_size:
            raise ValueError(f"prompts[{b}] holds token ids outside [0, vocab_size = {vocab_size})")
        out.append(p)
    return out


def per_request_ints(name: str, value, num_reqs: int, allow_none: bool = False) -> list:
    values = list(value) if isinstance(value, Sequence) else [value] * num_reqs
    if len(values) != num_reqs:
        raise ValueError(f"{name} must be one value or {num_reqs} values (one per prompt), got {len(values)}")
    for v in values:
        if v is None and allow_none:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must hold ints{' or None' if allow_none else ''}, got {v!r}")
    return values


def check_max_new_tokens(value, num_reqs: int) -> list[int]:
    values = per_request_ints("max_new_tokens", value, num_reqs)
    for v in values:
        if v < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {v}")
    return values


def check_eos(value, num_reqs: int, vocab_size: int) -> list[int]:
    values = per_request_ints("eos_token_id", value, num_reqs, allow_none=True)
    for v in values:
        if v is not None and not 0 <= v < vocab_size:
            raise ValueError(f"eos_token_id {v} is not in [0, vocab_size = {vocab_size})")
    return [-1 if v is None else v for v in values]


def check_generation_sampling(
    sampling: SamplingParams | None, num_reqs: int, proposer
) -> tuple[torch.Tensor, torch.Tensor]:
    """(temperature [B] fp32, seeds [B] int64) on the CPU; greedy when None. A
    temperature > 0 needs drafts the rejection sampler can correct for: greedy
    drafts (one-hot), or probabilistic drafts with their probs."""
    if sampling is None:
        return torch.zeros(num_reqs, dtype=torch.float32), torch.zeros(num_reqs, dtype=torch.int64)
    if not isinstance(sampling, SamplingParams):
        raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    temperature, seeds = sampling.temperature, sampling.seeds
    if not isinstance(temperature, torch.Tensor) or tuple(temperature.shape) != (num_reqs,):
        raise ValueError(f"sampling.temperature must be a [{num_reqs}] tensor (one per prompt)")
    if not temperature.is_floating_point():
        raise ValueError(f"sampling.temperature must be floating point, got {temperature.dtype}")
    if not isinstance(seeds, torch.Tensor) or tuple(seeds.shape) != (num_reqs,) or seeds.is_floating_point():
        raise ValueError(f"sampling.seeds must be a [{num_reqs}] int tensor (one per prompt)")
    temperature = temperature.detach().to("cpu", torch.float32)
    if not bool(torch.isfinite(temperature).all()) or bool((temperature < 0).any()):
        raise ValueError("sampling.temperature must be finite and >= 0 (0 = greedy)")
    if proposer is not None and bool((temperature > 0).any()):
        config = proposer.config
        if config.draft_sampling == "probabilistic" and config.return_probs != "probs":
            raise ValueError(
                "proposer.config: probabilistic drafts at temperature > 0 need return_probs='probs' "
                f"(rejection sampling divides by the draft's probabilities), got {config.return_probs!r}"
            )
    return temperature, seeds.detach().to("cpu", torch.int64)


def check_truncation(sampling: SamplingParams | None, num_reqs: int) -> dict[str, torch.Tensor]:
    """The request's truncation as CPU tensors {"top_k": int32, "top_p": fp32,
    "min_p": fp32} (those set; {} without sampling or truncation). top_k: ints (<= 0 or
    >= the vocabulary: off); top_p in (0, 1]; min_p in [0, 1]."""
    if sampling is None:
        return {}
    out = {}
    for name in ("top_k", "top_p", "min_p"):
        value = getattr(sampling, name)
        if value is None:
            continue
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (num_reqs,):
            raise ValueError(f"sampling.{name} must be a [{num_reqs}] tensor (one per prompt) or None")
        if name == "top_k":
            if value.is_floating_point() or value.dtype == torch.bool or value.is_complex():
                raise ValueError(f"sampling.top_k must be an int tensor (<= 0: off), got {value.dtype}")
            out[name] = value.detach().to("cpu", torch.int32)
            continue
        if not value.is_floating_point():
            raise ValueError(f"sampling.{name} must be floating point, got {value.dtype}")
        value = value.detach().to("cpu", torch.float32)
        low_open = name == "top_p"
        bad = ~((value > 0) if low_open else (value >= 0)) | ~(value <= 1)  # NaN fails both
        bound = "(0, 1] (1: off)" if low_open else "[0, 1] (0: off)"
        first_bad(f"sampling.{name}", bad, value, f"is outside {bound}")  # CPU tensors, before any run
        out[name] = value
    return out


def blocks_per_request(max_model_len: int, num_speculative_tokens: int, block_size: int) -> int:
    """KV blocks one request needs: a verify pass of a request that is at most at
    max_model_len - 1 reaches K positions further."""
    return math.ceil((max_model_len + num_speculative_tokens) / block_size)


def check_draft_capacity(proposer, num_blocks: int, num_reqs: int) -> None:
    for i, cache in enumerate(proposer.kv_caches):
        if cache.shape[1] < num_blocks:
            raise ValueError(
                f"proposer.kv_caches[{i}] holds {cache.shape[1]} blocks; this batch needs {num_blocks} "
                "(see specdraft.generation.num_kv_blocks)"
            )
    max_num_reqs = getattr(proposer, "max_num_reqs", None)  # the multi-layer proposer's shift cache
    if isinstance(max_num_reqs, int) and num_reqs > max_num_reqs:
        raise ValueError(f"prompts: {num_reqs} prompts, more than the proposer's max_num_reqs {max_num_reqs}")
