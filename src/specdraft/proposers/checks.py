"""Shape and dtype checks of the proposers' entry points: free of host syncs (they
read shapes only), each a ValueError naming the argument."""

from specdraft.checks import INDEX_DTYPES, check_dtype, check_rank, check_shape
from specdraft.layout import BatchMetadata


def check_batch(target_token_ids, target_positions, next_token_ids, metadata: BatchMetadata) -> int:
    """Token ids, positions, next tokens and the batch metadata agree; returns T."""
    check_dtype("target_token_ids", target_token_ids, INDEX_DTYPES)
    check_rank("target_token_ids", target_token_ids, 1)
    num_tokens = target_token_ids.shape[0]
    check_dtype("target_positions", target_positions, INDEX_DTYPES)
    check_rank("target_positions", target_positions, (1, 2))
    if target_positions.shape[-1] != num_tokens or (target_positions.dim() == 2 and target_positions.shape[0] != 3):
        raise ValueError(
            f"target_positions must have shape ({num_tokens},) or (3, {num_tokens}), got {tuple(target_positions.shape)}"
        )
    num_reqs = metadata.num_reqs
    check_shape("next_token_ids", next_token_ids, (num_reqs,))
    check_shape("query_start_loc", metadata.query_start_loc, (num_reqs + 1,))
    check_shape("slot_mapping", metadata.slot_mapping, (num_tokens,))
    if metadata.block_table.dim() != 2 or metadata.block_table.shape[0] != num_reqs:
        raise ValueError(
            f"block_table must have shape ({num_reqs}, max_blocks), got {tuple(metadata.block_table.shape)}"
        )
    return num_tokens


def check_propose_inputs(target_token_ids, target_positions, target_hidden_states, next_token_ids, metadata) -> None:
    num_tokens = check_batch(target_token_ids, target_positions, next_token_ids, metadata)
    check_rank("target_hidden_states", target_hidden_states, 2)
    if target_hidden_states.shape[0] != num_tokens:
        raise ValueError(f"target_hidden_states must have {num_tokens} rows, got {tuple(target_hidden_states.shape)}")
