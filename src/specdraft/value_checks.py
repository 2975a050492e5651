"""The pieces of checked mode's value checks (specdraft.checked_mode) that several
ops and the proposers share: the first offending entry, ranges, finiteness, the
windows of query_start_loc, draft counts. Each op's own checker sits beside the op
(`check_<op>_values` in its ops/ module; the op wrapper calls it when checked mode
is on); specdraft.testing re-exports them.

They read values on the host, so they sync: never call them on the compiled hot
path. Each raises a ValueError naming the argument, the expectation and the first
offending value. Bottom layer: torch only (the ops import it).
"""

import torch


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
