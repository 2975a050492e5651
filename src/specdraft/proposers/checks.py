"""The proposers' free checks: shape, dtype and configuration facts, read from
metadata only (no host sync), so they run in both modes and hold under
torch.compile. Each raises a ValueError naming the argument. The value-level checks
of checked mode are in proposers/value_checks.py.
"""

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, check_int_range, check_tensor_arg, same_size
from specdraft.config import SamplingParams
from specdraft.layout import BatchMetadata

# ------------------------------------------------------------------ the head


def uses_mrope(model) -> bool:
    return getattr(getattr(model, "config", None), "mrope_section", None) is not None


def hidden_width(model) -> int | None:
    """Width of the target hidden states the head reads (EAGLE-3: three aux layers
    concatenated), or None for a head that does not say (not one of ours)."""
    return getattr(model, "hidden_width", None)


def head_dtype(model) -> torch.dtype | None:
    """The dtype of the head's weights (its embedding's, else its first parameter's)."""
    embed = getattr(model, "embed_tokens", None) or getattr(getattr(model, "model", None), "embed_tokens", None)
    weight = getattr(embed, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.dtype
    first = next(iter(model.parameters()), None) if isinstance(model, torch.nn.Module) else None
    return None if first is None else first.dtype


def check_method(model, method: str) -> None:
    """config.method against the method the head says it needs (its `method`); a
    user's own head that says none is not checked."""
    want = getattr(model, "method", None)
    if want and method != want:
        raise ValueError(
            f"config.method is {method!r} but the head is {type(model).__name__}, which needs method={want!r}"
        )


def check_kv_caches(model, config, kv_caches: list[torch.Tensor], *, block_sizes: list[int] | None = None) -> None:
    """One cache per draft layer, each [2, num_blocks, block_size, kv_heads,
    head_dim] in the head's dtype and on its device. block_sizes: each cache's block
    size (default config.block_size for all)."""
    if len(kv_caches) != model.num_kv_layers:
        raise ValueError(
            f"kv_caches must hold {model.num_kv_layers} caches (one per draft layer), got {len(kv_caches)}"
        )
    model_config = getattr(model, "config", None)
    heads, dim = getattr(model_config, "num_kv_heads", None), getattr(model_config, "head_dim", None)
    dtype = head_dtype(model)
    for i, cache in enumerate(kv_caches):
        name = f"kv_caches[{i}]"
        check_tensor_arg(name, cache, rank=5, contiguous=True)
        size = config.block_size if block_sizes is None else block_sizes[i]
        if cache.shape[0] != 2 or cache.shape[2] != size:
            raise ValueError(
                f"{name} must have shape [2, num_blocks, block_size = {size}, kv_heads, head_dim] "
                f"(block size from {'config.block_size' if block_sizes is None else 'its group'}), "
                f"got {tuple(cache.shape)}"
            )
        if (heads is not None and cache.shape[3] != heads) or (dim is not None and cache.shape[4] != dim):
            raise ValueError(
                f"{name} must hold {heads} kv heads of {dim} features (the head's config), got {tuple(cache.shape)}"
            )
        if dtype is not None and cache.dtype != dtype:
            raise ValueError(f"{name} has dtype {cache.dtype} but the head's weights are {dtype}: they must match")


# ------------------------------------------------------------------ the batch


def check_num_reqs(per_request: dict[str, tuple[torch.Tensor, int]]) -> int:
    """B, as most per-request arguments say; the first one that disagrees is named.

    per_request: name -> (tensor, extra): tensor.shape[0] == B + extra."""
    implied = {name: tensor.shape[0] - extra for name, (tensor, extra) in per_request.items()}
    names = list(implied)
    votes = {name: sum(same_size(implied[other], implied[name]) for other in names) for name in names}
    num_reqs = implied[max(names, key=votes.__getitem__)]
    agree = [name for name in names if same_size(implied[name], num_reqs)]
    for name in names:
        if not same_size(implied[name], num_reqs):
            tensor, extra = per_request[name]
            rows = f"{num_reqs} + 1" if extra else f"{num_reqs}"
            raise ValueError(
                f"{name} must have {rows} rows ({', '.join(agree)} hold {num_reqs} requests), "
                f"got shape {tuple(tensor.shape)}"
            )
    return num_reqs


def check_static_bound(name: str, value, low: int, high=None) -> None:
    """A static bound: a Python int (or a SymInt under dynamic shapes), never a tensor."""
    if isinstance(value, torch.Tensor):
        raise ValueError(
            f"{name} must be a Python int (a static bound known on the host), got a tensor; pass int(...) "
            "of a host-side value"
        )
    check_int_range(name, value, low, high if isinstance(high, int) else None)


def check_batch(
    target_token_ids, target_positions, next_token_ids, metadata: BatchMetadata, *, block_size: int, model=None
) -> tuple[int, int]:
    """Token ids, positions, next tokens and the batch metadata agree; returns (T, B)."""
    if not isinstance(metadata, BatchMetadata):
        raise ValueError(f"metadata must be a BatchMetadata, got {type(metadata).__name__}")
    check_tensor_arg("target_token_ids", target_token_ids, INDEX_DTYPES, rank=1)
    num_tokens, device = target_token_ids.shape[0], target_token_ids
    check_tensor_arg(
        "target_positions", target_positions, INDEX_DTYPES, shape=[(num_tokens,), (3, num_tokens)], device_of=device
    )
    if target_positions.dim() == 2 and model is not None and not uses_mrope(model):
        raise ValueError(
            "target_positions: M-RoPE positions [3, T] given to a head without M-RoPE (its config.mrope_section "
            "is None); pass the 1-D positions [T]"
        )
    check_tensor_arg("next_token_ids", next_token_ids, INDEX_DTYPES, rank=1, device_of=device)
    check_tensor_arg("query_start_loc", metadata.query_start_loc, INDEX_DTYPES, rank=1, device_of=device)
    check_tensor_arg("seq_lens", metadata.seq_lens, INDEX_DTYPES, rank=1, device_of=device)
    check_tensor_arg("block_table", metadata.block_table, INDEX_DTYPES, rank=2, device_of=device)
    num_reqs = check_num_reqs({
        "query_start_loc": (metadata.query_start_loc, 1),
        "seq_lens": (metadata.seq_lens, 0),
        "next_token_ids": (next_token_ids, 0),
        "block_table": (metadata.block_table, 0),
    })  # fmt: skip
    check_tensor_arg("slot_mapping", metadata.slot_mapping, INDEX_DTYPES, shape=(num_tokens,), device_of=device)
    if guard_or_false(num_tokens < num_reqs):
        raise ValueError(
            f"target_token_ids: {num_tokens} tokens for {num_reqs} requests (every request samples from a window "
            "of at least one token)"
        )
    if metadata.block_table.shape[1] < 1:
        raise ValueError("block_table must have at least one column")
    check_static_bound("max_query_len", metadata.max_query_len, 1)
    reach = metadata.block_table.shape[1] * block_size
    if metadata.max_seq_len is not None:
        check_static_bound("max_seq_len", metadata.max_seq_len, 1)
        if isinstance(metadata.max_seq_len, int) and isinstance(reach, int) and metadata.max_seq_len > reach:
            raise ValueError(
                f"max_seq_len = {metadata.max_seq_len} is past the block table's reach "
                f"(width {metadata.block_table.shape[1]} x block_size {block_size} = {reach})"
            )
    return num_tokens, num_reqs


def check_hidden_states(model, target_hidden_states, num_tokens, device: torch.Tensor) -> None:
    """[T, width] in a float dtype the head converts from; width as the head reads it."""
    check_tensor_arg("target_hidden_states", target_hidden_states, FLOAT_DTYPES, rank=2, device_of=device)
    shape = tuple(target_hidden_states.shape)
    if target_hidden_states.shape[0] != num_tokens:
        raise ValueError(f"target_hidden_states must have {num_tokens} rows, got shape {shape}")
    width = hidden_width(model)
    if width is not None and not same_size(target_hidden_states.shape[1], width):
        what = getattr(model, "hidden_width_note", "the head's hidden width")
        raise ValueError(f"target_hidden_states must have {width} columns ({what}), got shape {shape}")


def check_sampling(config, sampling, num_reqs: int, device: torch.Tensor) -> None:
    if sampling is None:
        if config.draft_sampling == "probabilistic":
            raise ValueError(
                "sampling is None but config.draft_sampling is 'probabilistic': pass SamplingParams "
                "(temperature 0 rows stay greedy), or use draft_sampling='greedy'"
            )
        return
    if not isinstance(sampling, SamplingParams):
        raise ValueError(f"sampling must be a SamplingParams or None, got {type(sampling).__name__}")
    check_tensor_arg("sampling.temperature", sampling.temperature, torch.float32, shape=(num_reqs,), device_of=device)
    check_tensor_arg("sampling.seeds", sampling.seeds, INDEX_DTYPES, shape=(num_reqs,), device_of=device)


def check_propose_inputs(proposer, window, sampling, *, block_size: int, reads_hidden: bool) -> tuple[int, int]:
    """Every free check of `propose` on its TargetWindow (specdraft.proposers.loop);
    returns (T, B). block_size: the one the block table is in. reads_hidden: False
    for a proposer that ignores target_hidden_states (a standalone draft LM)."""
    model, ids = proposer.model, window.token_ids
    num_tokens, num_reqs = check_batch(
        ids, window.positions, window.next_token_ids, window.metadata, block_size=block_size, model=model
    )
    if reads_hidden:
        check_hidden_states(model, window.hidden_states, num_tokens, ids)
    check_sampling(proposer.config, sampling, num_reqs, ids)
    for name, value in (("token_indices_to_sample", window.token_indices_to_sample),
                        ("num_rejected_tokens", window.num_rejected_tokens)):  # fmt: skip
        check_tensor_arg(name, value, INDEX_DTYPES, shape=(num_reqs,), device_of=ids, optional=True)
    return num_tokens, num_reqs


def check_padded_inputs(proposer, sampled_token_ids, cu_num_draft_tokens, backup_next_token_ids, metadata,
                        discard_request_mask) -> None:  # fmt: skip
    """propose_padded's own arguments: [B, K + 1] sampled ids (the bonus column
    included), [B] cumulative draft counts, backup ids and the discard mask."""
    if not isinstance(metadata, BatchMetadata):
        raise ValueError(f"metadata must be a BatchMetadata, got {type(metadata).__name__}")
    check_tensor_arg("sampled_token_ids", sampled_token_ids, INDEX_DTYPES, rank=2)
    check_tensor_arg("cu_num_draft_tokens", cu_num_draft_tokens, INDEX_DTYPES, rank=1)
    check_tensor_arg("backup_next_token_ids", backup_next_token_ids, INDEX_DTYPES, rank=1)
    check_tensor_arg("query_start_loc", metadata.query_start_loc, INDEX_DTYPES, rank=1)
    check_tensor_arg("seq_lens", metadata.seq_lens, INDEX_DTYPES, rank=1)
    per_request = {
        "query_start_loc": (metadata.query_start_loc, 1),
        "seq_lens": (metadata.seq_lens, 0),
        "sampled_token_ids": (sampled_token_ids, 0),
        "cu_num_draft_tokens": (cu_num_draft_tokens, 0),
        "backup_next_token_ids": (backup_next_token_ids, 0),
    }
    if discard_request_mask is not None:
        check_tensor_arg("discard_request_mask", discard_request_mask, torch.bool, rank=1)
        per_request["discard_request_mask"] = (discard_request_mask, 0)
    num_reqs = check_num_reqs(per_request)
    k = proposer.num_speculative_tokens
    if not same_size(sampled_token_ids.shape[1], k + 1):
        raise ValueError(
            f"sampled_token_ids must have shape ({num_reqs}, K + 1 = {k + 1}): the K verified drafts and the "
            f"bonus column, got {tuple(sampled_token_ids.shape)}"
        )
