"""Value-level checks of the ops' arguments: checked mode's implementation for the
kernel layer (specdraft.checked_mode; the op wrappers call these when it is on).

They read values on the host, so they sync: never call them on the compiled hot
path. Each raises a ValueError naming the argument, the expectation and the first
offending value. Bottom layer: torch only (the ops import it).

Since they are public (re-exported by specdraft.testing), they also serve tests and
engines that want to check one op's input by hand.
"""

import torch

# ------------------------------------------------------------------------ helpers


def _where(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]"


def first_bad(name: str, bad: torch.Tensor, values: torch.Tensor, expectation: str) -> None:
    """Raise for the first True of `bad` (same shape as `values`): "name[i] = v
    expectation". One host sync when nothing is wrong."""
    if bool(bad.any()):
        index = tuple(int(i) for i in torch.nonzero(bad)[0])
        value = values[index].item()
        raise ValueError(f"{name}{_where(index)} = {value} {expectation}")


def check_in_range(name: str, values: torch.Tensor, low: int, high: int | None, allow: int | None = None) -> None:
    """Every entry in [low, high) (high None: no upper bound), or equal to `allow`."""
    bad = values < low
    if high is not None:
        bad = bad | (values >= high)
    if allow is not None:
        bad = bad & (values != allow)
    extra = f" (or {allow})" if allow is not None else ""
    expectation = f"is outside [{low}, {high}){extra}" if high is not None else f"is below {low}{extra}"
    first_bad(name, bad, values, expectation)


def check_finite(name: str, values: torch.Tensor) -> None:
    first_bad(name, ~torch.isfinite(values), values, "is not finite")


def check_weight_finite(name: str, values: torch.Tensor, context: str = "") -> None:
    """Every entry of a weight tensor finite (a non-floating tensor is finite by
    type). A weight has millions of entries and no meaningful index, so the
    ValueError says "{name} must be finite, found N NaN and M Inf among its K values
    (the first at flat index i: v){context}". One host sync when nothing is wrong."""
    if not values.is_floating_point():
        return
    flat = values.detach().reshape(-1)
    finite = torch.isfinite(flat)
    if bool(finite.all()):
        return
    nans, infs = int(torch.isnan(flat).sum()), int(torch.isinf(flat).sum())
    first = int((~finite).to(torch.int8).argmax())
    raise ValueError(
        f"{name} must be finite, found {nans} NaN and {infs} Inf among its {flat.numel()} values "
        f"(the first at flat index {first}: {flat[first].item()}){context}"
    )


def window_lengths(
    query_start_loc: torch.Tensor, num_tokens: int | None = None, *, nonempty: bool = False,
    name: str = "query_start_loc",
) -> list[int]:  # fmt: skip
    """The windows of query_start_loc [B + 1]: it starts at 0, never decreases and
    (num_tokens given) ends at or before num_tokens; nonempty: every window holds a
    token. Returns the window lengths."""
    qsl = query_start_loc.tolist()
    if qsl and qsl[0] != 0:
        raise ValueError(f"{name}[0] = {qsl[0]}: {name} must start at 0")
    lens = [qsl[b + 1] - qsl[b] for b in range(len(qsl) - 1)]
    for b, n in enumerate(lens):
        if n < 0:
            raise ValueError(f"{name} must be non-decreasing: {name}[{b}] = {qsl[b]} > {name}[{b + 1}] = {qsl[b + 1]}")
        if nonempty and n == 0:
            raise ValueError(f"{name}: request {b} has an empty window ({name}[{b}] = {name}[{b + 1}] = {qsl[b]})")
    if num_tokens is not None and qsl and qsl[-1] > num_tokens:
        raise ValueError(f"{name}[{len(qsl) - 1}] = {qsl[-1]} is past the {num_tokens} tokens of the batch")
    return lens


# ------------------------------------------------------------- the shift ops


def check_shift_and_cache_values(
    query_start_loc: torch.Tensor,
    token_indices_to_sample: torch.Tensor,
    shift: torch.Tensor,
    cached_lens: torch.Tensor,
    max_shift: int,
    num_tokens: int | None = None,
) -> None:
    """A shift-and-cache input: query_start_loc from 0, non-decreasing, within
    num_tokens; 0 <= cached_lens <= max_shift; 0 <= shift <= cached_lens; a sample
    index inside its (non-empty) window."""
    lens = window_lengths(query_start_loc, num_tokens)
    qsl = query_start_loc.tolist()
    samples, shifts, cached = token_indices_to_sample.tolist(), shift.tolist(), cached_lens.tolist()
    for b, n in enumerate(lens):
        start, stop = qsl[b], qsl[b + 1]
        if not 0 <= cached[b] <= max_shift:
            raise ValueError(f"cached_lens[{b}] = {cached[b]} is outside [0, max_shift={max_shift}]")
        if not 0 <= shifts[b] <= cached[b]:
            raise ValueError(f"shift[{b}] = {shifts[b]} is outside [0, cached_lens[{b}]={cached[b]}]")
        if n > 0 and not start <= samples[b] < stop:
            raise ValueError(f"token_indices_to_sample[{b}] = {samples[b]} is outside its window [{start}, {stop})")


def check_shift_plan_values(
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    token_indices_to_sample: torch.Tensor | None,
    seq_lens: torch.Tensor,
    cached_lens: torch.Tensor,
    max_shift: int,
) -> None:
    """A shift_plan / adjust_input input: windows as for shift-and-cache within the
    positions' T tokens, 0 <= cached_lens <= max_shift, each sample index inside its
    window, seq_lens at least the window, positions (row 0) non-negative."""
    num_tokens = positions.shape[-1]
    lens = window_lengths(query_start_loc, num_tokens)
    qsl = query_start_loc.tolist()
    samples = None if token_indices_to_sample is None else token_indices_to_sample.tolist()
    cached, seq = cached_lens.tolist(), seq_lens.tolist()
    for b, n in enumerate(lens):
        if not 0 <= cached[b] <= max_shift:
            raise ValueError(f"cached_lens[{b}] = {cached[b]} is outside [0, max_shift={max_shift}]")
        if seq[b] < n:
            raise ValueError(f"seq_lens[{b}] = {seq[b]} is shorter than request {b}'s window of {n} tokens")
        if samples is not None and n > 0 and not qsl[b] <= samples[b] < qsl[b + 1]:
            raise ValueError(
                f"token_indices_to_sample[{b}] = {samples[b]} is outside its window [{qsl[b]}, {qsl[b + 1]})"
            )
    row = positions[0] if positions.dim() == 2 else positions
    check_in_range("positions", row[: qsl[-1] if qsl else 0], 0, None)


# ---------------------------------------------------------- batch preparation


def check_rejection_values(
    query_start_loc: torch.Tensor,
    num_rejected_tokens: torch.Tensor | None = None,
    cu_num_draft_tokens: torch.Tensor | None = None,
    valid_sampled_tokens_count: torch.Tensor | None = None,
    *,
    name: str = "query_start_loc",
    num_tokens: int | None = None,
) -> None:
    """The prepare-inputs arguments (prepare_eagle_input, prepare_inputs_padded):
    query_start_loc from 0, non-decreasing; a rejected count in [0, query length]; a
    draft count (from the *inclusive* cumulative cu_num_draft_tokens) >= 0 and below
    the query length (the window holds the drafts and the token before them); a
    valid count in [0, drafts + 1] (0: a discarded request, as
    prepare_next_token_padded reports it). name: what the caller calls
    query_start_loc. num_tokens (prepare_eagle_input's output length): at least the
    kept total, sum of (query length - rejected)."""
    lens = window_lengths(query_start_loc, name=name)
    if num_rejected_tokens is not None:
        rejected = num_rejected_tokens.tolist()
        for b, r in enumerate(rejected):
            if not 0 <= r <= lens[b]:
                raise ValueError(f"num_rejected_tokens[{b}] = {r} is outside [0, query length {lens[b]}]")
        kept = sum(lens) - sum(rejected)
        if num_tokens is not None and num_tokens < kept:
            raise ValueError(
                f"num_tokens = {num_tokens} is smaller than the {kept} tokens the requests keep "
                "(sum of query lengths minus num_rejected_tokens)"
            )
    if cu_num_draft_tokens is not None:
        drafts = draft_counts(cu_num_draft_tokens, lens)
        if valid_sampled_tokens_count is not None:
            for b, v in enumerate(valid_sampled_tokens_count.tolist()):
                if not 0 <= v <= drafts[b] + 1:
                    raise ValueError(
                        f"valid_sampled_tokens_count[{b}] = {v} is outside [0, drafts + 1 = {drafts[b] + 1}]"
                    )


def draft_counts(cu_num_draft_tokens: torch.Tensor, window_lens: list[int]) -> list[int]:
    """Per-request draft counts of the inclusive cumulative sum (entry b counts
    requests 0..b), each >= 0 and below its window's length."""
    cu = cu_num_draft_tokens.tolist()
    drafts = [c - (cu[b - 1] if b else 0) for b, c in enumerate(cu)]
    for b, d in enumerate(drafts):
        if d < 0 or (d > 0 and d >= window_lens[b]):
            raise ValueError(
                f"cu_num_draft_tokens: request {b} has {d} drafts in a window of {window_lens[b]} tokens "
                "(cu_num_draft_tokens must be the inclusive cumulative sum of draft counts: entry b counts "
                "requests 0..b; a window holds its drafts and the token before them)"
            )
    return drafts


def check_next_token_values(
    backup_next_token_ids: torch.Tensor, vocab_size: int, sampled_token_ids: torch.Tensor | None = None
) -> None:
    """prepare_next_token_padded: the backup tokens become next tokens, so they are
    ids; sampled ids are ids in [0, vocab_size) or the -1 placeholder after a
    rejection. (Unchecked, an id outside that counts as rejected.)"""
    check_in_range("backup_next_token_ids", backup_next_token_ids, 0, vocab_size)
    if sampled_token_ids is not None:
        check_in_range("sampled_token_ids", sampled_token_ids, 0, vocab_size, allow=-1)


def check_step_metadata_values(
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_model_len: int,
    *,
    block_size: int | None = None,
    seq_index: torch.Tensor | None = None,
) -> None:
    """A `step_metadata` input: positions (row 0) and seq_index non-negative, seq_lens
    >= 1, no negative block id in the rows of the batch, and no block written by two
    requests. With block_size, "written" means the block this step's token lands in
    (requests may share full prefix blocks, as prefix caching does); without it, any
    block shared by two requests is refused.

    seq_lens past max_model_len are accepted: a verify window may reach past it by K
    tokens, and the op caps them (min(seq_len + 1, max_model_len))."""
    first = (positions[0] if positions.dim() == 2 else positions).tolist()
    for b, p in enumerate(first):
        if p < 0:
            raise ValueError(f"positions[{b}] = {p} is negative")
    index = first if seq_index is None else seq_index.tolist()
    if seq_index is not None:
        for b, i in enumerate(index):
            if i < 0:
                raise ValueError(f"seq_index[{b}] = {i} is negative")
    for b, s in enumerate(seq_lens.tolist()):
        if s < 1:
            raise ValueError(f"seq_lens[{b}] = {s} must be >= 1")
    rows = block_table[: len(first)].tolist()
    owner: dict[int, int] = {}
    for b, row in enumerate(rows):
        for blk in row:
            if blk < 0:
                raise ValueError(f"block_table[{b}] holds a negative block id {blk}")
            if block_size is None and owner.setdefault(blk, b) != b:
                raise ValueError(f"block_table: block {blk} belongs to requests {owner[blk]} and {b}")
    if block_size is None:
        return
    held = {}
    for b, row in enumerate(rows):
        for blk in row:
            held.setdefault(blk, set()).add(b)
    for b, i in enumerate(index):
        new = i + 1
        if new >= max_model_len:
            continue  # clamped: writes nothing
        if new // block_size >= len(rows[b]):
            raise ValueError(
                f"block_table: request {b}'s next token at position {new} is in block column "
                f"{new // block_size}, past the table's {len(rows[b])} columns (block_size {block_size}); "
                "unchecked mode would write it into the last column's block"
            )
        blk = rows[b][new // block_size]
        others = held.get(blk, set()) - {b}
        if others:
            raise ValueError(
                f"block_table: request {b} writes block {blk} this step, which request {min(others)} also holds"
            )


# ---------------------------------------------------------- parallel drafting


def check_copy_and_expand_values(
    query_start_loc: torch.Tensor, num_rejected_tokens: torch.Tensor | None, num_tokens: int
) -> None:
    """copy_and_expand_inputs: windows from 0, non-decreasing, at least one token
    each, within the T_in input tokens; 0 <= num_rejected_tokens <= window - 1."""
    lens = window_lengths(query_start_loc, num_tokens, nonempty=True)
    if num_rejected_tokens is not None:
        for b, r in enumerate(num_rejected_tokens.tolist()):
            if not 0 <= r <= lens[b] - 1:
                raise ValueError(f"num_rejected_tokens[{b}] = {r} is outside [0, window - 1 = {lens[b] - 1}]")


def check_new_slot_mapping_values(
    positions: torch.Tensor,
    is_rejected_token_mask: torch.Tensor | None,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    max_model_len: int,
) -> None:
    """new_slot_mapping: windows from 0, non-decreasing, within T; positions inside
    the windows non-negative; every block id a slot is taken from (tokens in a
    window, not rejected, below max_model_len) non-negative. Other entries of the
    table are not read, so they may hold anything (engines pad tables)."""
    lens = window_lengths(query_start_loc, positions.shape[0])
    total = sum(lens)
    pos = positions[:total].long().cpu()
    check_in_range("positions", pos, 0, None)
    if total == 0:
        return
    owner = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    wanted = pos.clamp(max=max_model_len - 1) // block_size
    used = pos < max_model_len
    if is_rejected_token_mask is not None:
        used = used & ~is_rejected_token_mask[:total].cpu()
    past = torch.nonzero(used & (wanted >= block_table.shape[1]))
    if past.numel():
        t = int(past[0, 0])
        raise ValueError(
            f"block_table: token {t} (request {int(owner[t])}) at position {int(pos[t])} is in block column "
            f"{int(wanted[t])}, past the table's {block_table.shape[1]} columns (block_size {block_size}); "
            "unchecked mode would take its slot from the last column's block"
        )
    column = wanted.clamp(max=block_table.shape[1] - 1)
    blocks = block_table.cpu().long()[owner, column]
    bad = torch.nonzero(used & (blocks < 0))
    if bad.numel():
        t = int(bad[0, 0])
        raise ValueError(
            f"block_table[{int(owner[t])}, {int(column[t])}] = {int(blocks[t])} is negative "
            f"(the block of token {t} at position {int(pos[t])})"
        )


def check_extend_queries_values(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """extend_queries_by_n: windows from 0, non-decreasing, each seq_len at least
    its window."""
    lens = window_lengths(query_start_loc)
    for b, s in enumerate(seq_lens.tolist()):
        if s < lens[b]:
            raise ValueError(f"seq_lens[{b}] = {s} is shorter than request {b}'s window of {lens[b]} tokens")


# ----------------------------------------------------------------- sampling


def check_draft_sample_values(
    temperature: torch.Tensor,
    probs_out: torch.Tensor | None = None,
    step: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> None:
    """draft_sample: temperature finite and >= 0; step inside [0, K); positions (the
    noise's counter) non-negative."""
    first_bad("temperature", ~(torch.isfinite(temperature) & (temperature >= 0)), temperature,
              "must be finite and >= 0 (0 = greedy)")  # fmt: skip
    if positions is not None:
        check_in_range("positions", positions, 0, None)
    if probs_out is not None and step is not None:
        s, num_steps = int(step), probs_out.shape[1]
        if not 0 <= s < num_steps:
            raise ValueError(f"step = {s} is outside [0, K={num_steps}) of probs_out")


def check_rejection_sample_values(
    draft_tokens: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    vocab: int,
    draft_probs: torch.Tensor | None = None,
) -> None:
    """rejection_sample: temperature finite and >= 0; 0 <= num_draft_tokens <= K;
    draft ids in [0, vocab) for the first num_draft_tokens entries and -1 after;
    draft_probs non-negative and finite."""
    check_draft_sample_values(temperature)
    num_spec = draft_tokens.shape[1]
    drafts, counts = draft_tokens.tolist(), num_draft_tokens.tolist()
    for b, (row, n) in enumerate(zip(drafts, counts, strict=True)):
        if not 0 <= n <= num_spec:
            raise ValueError(f"num_draft_tokens[{b}] = {n} is outside [0, K={num_spec}]")
        for j, token in enumerate(row):
            if j < n and not 0 <= token < vocab:
                raise ValueError(f"draft_tokens[{b}, {j}] = {token} is outside [0, vocab={vocab})")
            if j >= n and token != -1:
                raise ValueError(f"draft_tokens[{b}, {j}] = {token} must be -1 past num_draft_tokens[{b}] = {n}")
    if draft_probs is not None and not (torch.isfinite(draft_probs).all() and (draft_probs >= 0).all()):
        raise ValueError("draft_probs must be finite and non-negative")
    if draft_probs is not None:
        # A sampled row's draft was drawn from draft_probs: probability 0 means the
        # probabilities are not the ones it was drawn from (an all-zero row, say).
        # Greedy rows read no draft_probs.
        steps = torch.arange(num_spec, device=draft_tokens.device)
        drafted = (steps < num_draft_tokens[:, None]) & (temperature > 0)[:, None]
        q = draft_probs.gather(2, draft_tokens.long().clamp(min=0)[..., None])[..., 0]
        bad = torch.nonzero(drafted & ~(q > 0))
        if bad.numel():
            b, j = (int(i) for i in bad[0])
            token = drafts[b][j]
            raise ValueError(
                f"draft_probs[{b}, {j}, {token}] = {float(q[b, j])}: drafted token {token} has no "
                "probability, so it cannot have been sampled from these draft_probs"
            )
