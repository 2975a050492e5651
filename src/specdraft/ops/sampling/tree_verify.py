"""Target-side verification of a draft tree (issue 26, after the tree build of
specdraft.proposers.tree_build): walk the tree from the root, accept a path of draft
tokens and emit one more token from the target, greedy or sampled without loss.

The tree of request b (specdraft.proposers.tree_build's layout): N nodes, node 0 the
root, parents[b, j] < j the parent of node j (-1 for the root), target_logits[b, j]
the target's logits for the token after node j's context. The children of node c are
the nodes j > c with parents[b, j] == c, tried in ascending node index (tree_build
lays siblings out in draft-score order). With T = temperature[b]:

- greedy (T <= 0): from the current node, descend into the first child whose token
  equals argmax(target_logits[b, c]) (the lowest id on ties, as torch.argmax); when
  no child matches, emit that argmax (the bonus token).
- sampled (T > 0): multi-candidate rejection for deterministic (top-k) drafts. With
  p = softmax(target_logits[b, c] / T), the residual r = p and its mass R = 1, try
  the children in order: child x is accepted with probability r(x) / R (u * R <= r(x),
  r(x) > 0); if rejected, R -= r(x) and r(x) = 0, and the next sibling is tried. An
  accepted child becomes the current node (fresh p, r, R). When every child is
  rejected, emit a sample of r / R; at a leaf (or at depth max_depth), a sample of p.
  A draft id outside [0, V), a zero-probability draft and a duplicate of a rejected
  sibling (its r is already 0) are never accepted.

Why it is lossless (the emitted tokens are distributed as sampling the target
alone): at one node, let r_i, R_i be the residual and its mass once the first i
children are rejected (r_0 = p, R_0 = 1). Claim: given that the walk reaches child
i + 1, the token emitted next (x_{i+1} if accepted, else later) has law r_i / R_i.
After the last child this is the emission rule. Otherwise, by induction,
P(y) = [y = x] r_i(x) / R_i + (1 - r_i(x) / R_i) r_{i+1}(y) / R_{i+1} with
R_{i+1} = R_i - r_i(x) and r_{i+1} = r_i with x zeroed, which is r_i(y) / R_i for
every y. At i = 0: the next token has law p. Accepting x makes the child the current
node, whose target row is the target's distribution after x, so by induction on the
depth the whole emitted sequence has the target's law (sequential rejection sampling
of p with point-mass proposals). Every draw is fresh: one walk visits one node per
depth, and the noise is keyed by depth and sibling rank (below).

All-zero residual: a rejection that empties r has probability 0 (a child holding all
of the remaining mass, r(x) = R, is accepted for every u < 1). In floating point R
is 1 minus the rejected mass and may stay a rounding error above r(x); should r end
all zero, the emitted token is sampled from p instead (as rejection_sample does).

Noise: the counter-based hash of noise.py, as rejection_sample draws it, with
positions[b] the position of the depth-1 nodes: the acceptance uniform of the child
of sibling rank k at a node of depth d is token index k at position positions[b] + d
in STREAM_ACCEPT; the emitted token at depth d draws position positions[b] + d in
STREAM_SAMPLE, by the exponential race over r (fallback p) after rejections or
Gumbel-max over target_logits / T at a leaf. A chain (every node's parent the one
before) therefore gives exactly rejection_sample's tokens without draft_probs.

Truncation (top-k / top-p / min-p): with `logit_cut` [B, N], one cut per node row
(ops.truncation_cut of target_logits viewed as [B * N, V]), a sampled request's p at
node c is softmax(target_logits[b, c] / T) restricted to {i : target_logits[b, c, i]
>= cut[b, c]}, renormalised, everywhere above (acceptance, residual, leaf sample):
the emitted tokens follow the truncated target; a child the cut removes has p = 0
and is never accepted. The noise is unchanged: the cut only masks. Greedy requests
do not read the cut.

Outputs, with D = max_depth (default N - 1, the deepest any tree of N nodes goes):
nodes [B, D + 1] (node 0, then the accepted node at each depth, -1 after), tokens
[B, D + 1] (the accepted draft tokens, the emitted token, -1 after), counts [B]
(accepted drafts), ranks [B, D] (sibling rank of each accepted draft, -1 after).
Nodes deeper than D are never accepted.

The Triton kernels are verify_kernels.py's statistics of every row (shared with
rejection_sample), tree_walk.py's ascending pass over the nodes per request, then
verify_kernels.py's finish of the race over the emitting row;
the reference below, their torch twin, walks one depth per step.
"""

from typing import NamedTuple

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.library import triton_op, wrap_triton

from specdraft.checked_mode import is_checked
from specdraft.checks import FLOAT_DTYPES, INDEX_DTYPES, at_least, check_int_range, check_tensor_arg
from specdraft.value_checks import first_bad

from ..backend import NAMESPACE, cdiv, next_power_of_2, use_triton
from ..common.fastmath import FAST_LOG2
from .draft import (
    argmax_skipping_nan,
    check_draft_sample_values,
    check_logit_cut_arg,
    check_logit_cut_values,
    truncate_logits,
)
from .noise import (
    STREAM_ACCEPT,
    STREAM_SAMPLE,
    check_request_params,
    check_salt,
    exponential2_torch,
    gumbel2_torch,
    gumbel_gain_torch,
    noise_bits_torch,
    row_key_torch,
    salt_key,
    uniform_torch,
)
from .tiles import RS_LARGE_FROM, RS_TILES_LARGE, RS_TILES_SMALL, SPLIT_BLOCK
from .tree_walk import tree_walk_kernel
from .verify_kernels import race_finish_kernel, target_stats_kernel


class AcceptedPath(NamedTuple):
    """tree_verify's outputs (int32; module docstring): nodes [B, D + 1], tokens
    [B, D + 1], counts [B], ranks [B, D]."""

    nodes: torch.Tensor
    tokens: torch.Tensor
    counts: torch.Tensor
    ranks: torch.Tensor


# ------------------------------------------------------------------------ reference


def _gather_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t [B, N, V], index [B] -> t[b, index[b]] [B, V]."""
    return t.gather(1, index.view(-1, 1, 1).expand(-1, 1, t.shape[-1])).squeeze(1)


def _mark(tokens: torch.Tensor, where: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, V] bool: token v is tokens[b, j] for some j with where[b, j]."""
    slot = torch.where(where, tokens, vocab)  # column V: a dump for the unmarked
    hit = torch.zeros(tokens.shape[0], vocab + 1, device=tokens.device).scatter(1, slot, 1.0)
    return hit[:, :vocab] > 0


def tree_verify_reference(
    tree_tokens, parents, target_logits, temperature, seeds, positions, max_depth: int, salt=0, logit_cut=None
):
    """The walk one depth per step: all children of the current node at once (the
    sequential rule's tests in closed form: rejected mass before child j is the sum
    of r over the earlier children), the first accepted child descends."""
    num_reqs, num_nodes = tree_tokens.shape
    vocab, device = target_logits.shape[-1], target_logits.device
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    target_argmax = argmax_skipping_nan(target_logits.float())
    x = truncate_logits(target_logits, temperature, logit_cut)  # greedy rows: untouched
    p = torch.softmax(x / scale[:, None, None], -1)
    tokens, parents = tree_tokens.long(), parents.long()
    valid = (tokens >= 0) & (tokens < vocab)
    safe = torch.where(valid, tokens, 0)
    node = torch.arange(num_nodes, device=device)
    depths = torch.arange(max_depth + 1, device=device)
    accept_keys = row_key_torch(seeds[:, None], positions.long()[:, None] + depths, salt_key(salt, STREAM_ACCEPT))
    cur = torch.zeros(num_reqs, dtype=torch.long, device=device)
    count = torch.zeros_like(cur)
    path, path_ranks = [cur], []
    for step in range(max_depth):
        child = (parents == cur[:, None]) & (node > cur[:, None]) & (count == step)[:, None]
        # Each token's first child; a later duplicate finds it already zeroed.
        first = torch.full((num_reqs, vocab + 1), num_nodes, device=device)
        first = first.scatter_reduce(1, torch.where(child & valid, safe, vocab), node.expand_as(safe), "amin")
        fresh = child & valid & (first.gather(1, safe) == node)
        r = torch.where(fresh, _gather_rows(p, cur).gather(1, safe), 0.0)
        rank = child.long().cumsum(1) - 1
        u = uniform_torch(noise_bits_torch(accept_keys.gather(1, count[:, None]), rank.clamp(min=0)))
        sampled_ok = (r > 0) & (u * (1.0 - (r.cumsum(1) - r)) <= r)
        greedy_ok = valid & (tokens == target_argmax.gather(1, cur[:, None]))
        ok = child & torch.where(greedy[:, None], greedy_ok, sampled_ok)
        winner = torch.where(ok, node, num_nodes).amin(1)
        moved = winner < num_nodes
        winner = torch.where(moved, winner, 0)
        path.append(torch.where(moved, winner, -1))
        path_ranks.append(torch.where(moved, rank.gather(1, winner[:, None])[:, 0], -1))
        cur = torch.where(moved, winner, cur)
        count = count + moved.long()

    # The emitted token: the children of `cur` (if tried) were all rejected.
    tried = (parents == cur[:, None]) & (node > cur[:, None]) & (count < max_depth)[:, None]
    vocab_ids = torch.arange(vocab, device=device)
    bits = noise_bits_torch(
        row_key_torch(seeds, positions.long() + count, salt_key(salt, STREAM_SAMPLE))[:, None], vocab_ids
    )
    e = exponential2_torch(bits)  # E / ln 2: the same winners as E
    p_cur = _gather_rows(p, cur)
    race = torch.where(_mark(safe, tried & valid, vocab), 0.0, p_cur) / e
    recovered = torch.where((race > 0).any(-1), race.argmax(-1), (p_cur / e).argmax(-1))
    bonus = argmax_skipping_nan(_gather_rows(x, cur) * gumbel_gain_torch(temperature)[:, None] + gumbel2_torch(bits))
    sampled = torch.where(tried.any(1), recovered, bonus)
    emitted = torch.where(greedy, target_argmax.gather(1, cur[:, None])[:, 0], sampled)

    nodes = torch.stack(path, 1)
    ranks = torch.stack(path_ranks, 1) if path_ranks else torch.zeros(num_reqs, 0, dtype=torch.long, device=device)
    slots = torch.arange(max_depth + 1, device=device)
    drafts = torch.where(nodes > 0, tokens.gather(1, nodes.clamp(min=0)), -1)[:, 1:]
    padded = torch.cat([drafts, torch.full_like(count[:, None], -1)], 1)
    out = torch.where(slots < count[:, None], padded, torch.where(slots == count[:, None], emitted[:, None], -1))
    return tuple(t.to(torch.int32) for t in (nodes, out, count, ranks))


# --------------------------------------------------------------------------- the op


def _outputs(num_reqs: int, max_depth: int, device):
    nodes = torch.empty((num_reqs, max_depth + 1), dtype=torch.int32, device=device)
    tokens = torch.empty((num_reqs, max_depth + 1), dtype=torch.int32, device=device)
    counts = torch.empty((num_reqs,), dtype=torch.int32, device=device)
    ranks = torch.empty((num_reqs, max_depth), dtype=torch.int32, device=device)
    return nodes, tokens, counts, ranks


def _launch(tree_tokens, parents, target_logits, temperature, seeds, positions, max_depth, salt, logit_cut):
    num_reqs, num_nodes = tree_tokens.shape
    vocab, device = target_logits.shape[-1], target_logits.device
    outs = _outputs(num_reqs, max_depth, device)
    if num_reqs == 0:
        return outs
    nodes, tokens, counts, ranks = outs
    large = statically_known_true(num_reqs * num_nodes * vocab >= RS_LARGE_FROM)
    chunk, block, warps = RS_TILES_LARGE if large else RS_TILES_SMALL
    num_splits = cdiv(vocab, chunk)
    stat_shape = (num_reqs, num_nodes, num_splits)
    part_key = torch.empty(stat_shape, dtype=torch.float32, device=device)
    part_idx = torch.empty(stat_shape, dtype=torch.int32, device=device)
    part_max = torch.empty(stat_shape, dtype=torch.float32, device=device)
    part_sum = torch.empty(stat_shape, dtype=torch.float32, device=device)
    race_key = torch.empty((num_reqs, num_splits), dtype=torch.float32, device=device)
    race_idx = torch.empty((num_reqs, num_splits), dtype=torch.int32, device=device)
    fall_key, fall_idx = torch.empty_like(race_key), torch.empty_like(race_idx)
    strides = (target_logits.stride(0), target_logits.stride(1))
    cut_ptr = temperature if logit_cut is None else logit_cut  # unread without a cut
    has_cut = logit_cut is not None

    wrap_triton(target_stats_kernel)[(num_reqs, num_nodes, num_splits)](
        target_logits, temperature, temperature, cut_ptr, part_key, part_idx, part_max, part_sum,  # no num_draft
        vocab, *strides, num_nodes, num_splits,
        ROWS_OF_DRAFTS=False, HAS_CUT=has_cut, CHUNK=chunk, BLOCK=block, FAST_LOG2=FAST_LOG2, num_warps=warps,
    )  # fmt: skip
    wrap_triton(tree_walk_kernel)[(num_reqs, num_splits)](
        target_logits, tree_tokens, parents, temperature, seeds, positions, cut_ptr, nodes, tokens, counts, ranks,
        part_key, part_idx, part_max, part_sum, race_key, race_idx, fall_key, fall_idx,
        vocab, *strides, num_nodes, max_depth, num_splits,
        ACCEPT_KEY=salt_key(salt, STREAM_ACCEPT), SAMPLE_KEY=salt_key(salt, STREAM_SAMPLE), HAS_CUT=has_cut,
        NODE_BLOCK=next_power_of_2(num_nodes), CHUNK=chunk, BLOCK=block, SPLIT_BLOCK=SPLIT_BLOCK,
        FAST_LOG2=FAST_LOG2, num_warps=warps,
    )  # fmt: skip
    wrap_triton(race_finish_kernel)[(num_reqs,)](
        temperature, tokens, counts, race_key, race_idx, fall_key, fall_idx, max_depth + 1, num_splits,
        SPLIT_BLOCK=SPLIT_BLOCK, num_warps=1,
    )  # fmt: skip
    return outs


@triton_op(f"{NAMESPACE}::tree_verify", mutates_args=())
def _tree_verify_op(
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    max_depth: int,
    salt: int,
    logit_cut: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    args = (tree_tokens, parents, target_logits, temperature, seeds, positions, max_depth, salt, logit_cut)
    if not use_triton(target_logits):
        return tree_verify_reference(*args)
    return _launch(*args)


@_tree_verify_op.register_fake
def _tree_verify_fake(
    tree_tokens, parents, target_logits, temperature, seeds, positions, max_depth, salt, logit_cut=None
):
    return _outputs(tree_tokens.shape[0], max_depth, tree_tokens.device)


# ------------------------------------------------------------------ public wrapper


def check_tree_verify_values(
    tree_tokens: torch.Tensor, parents: torch.Tensor, temperature: torch.Tensor, vocab: int, max_depth: int
) -> None:
    """tree_verify's value contracts (checked mode; syncs): temperature finite and
    >= 0; parents[b, 0] == -1 and, for j >= 1, 0 <= parents[b, j] < j or -1 (a padding
    node, never reached: a budgeted pass's tree ends in them, none after the first);
    the tokens of the other nodes (j >= 1) in [0, vocab); no node deeper than
    max_depth."""
    check_draft_sample_values(temperature)
    num_nodes = parents.shape[1]
    node = torch.arange(num_nodes, device=parents.device)
    padding = (node > 0) & (parents == -1)
    first_bad("parents", (node == 0) & (parents != -1), parents, "must be -1: node 0 is the root")
    first_bad("parents", (node > 0) & ~padding & ((parents < 0) | (parents >= node)), parents,
              "is not an earlier node nor -1 (padding): a parent comes before its children "
              "(0 <= parents[b, j] < j)")  # fmt: skip
    after_padding = (padding.long().cumsum(1) > 0) & ~padding
    first_bad("parents", after_padding, parents, "follows a padding node (-1 past the root): padding ends the tree")
    first_bad("tree_tokens", (node > 0) & ~padding & ((tree_tokens < 0) | (tree_tokens >= vocab)), tree_tokens,
              f"is outside [0, vocab={vocab})")  # fmt: skip
    depth = torch.zeros_like(parents)
    for j in range(1, num_nodes):
        depth[:, j] = depth.gather(1, parents[:, j : j + 1].clamp(min=0)).squeeze(1) + 1
    depth = torch.where(padding, 0, depth)
    if bool((depth > max_depth).any()):
        b, j = (int(i) for i in torch.nonzero(depth > max_depth)[0])
        raise ValueError(f"max_depth = {max_depth} is below the depth {int(depth[b, j])} of node {j} of request {b}")


def tree_verify(
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    max_depth: int | None = None,
    salt: int = 0,
    logit_cut: torch.Tensor | None = None,
) -> AcceptedPath:
    """Verify a draft tree per request against the target: the accepted path and the
    emitted tokens, greedy or lossless sampled (the rule: the module docstring).

    Value-level contracts (check_tree_verify_values) are checked in checked mode
    (specdraft.checked_mode); outside it, a node whose parent is not an earlier node
    is never reached, a draft id outside [0, V) is never accepted, and nodes deeper
    than max_depth are never accepted.

    Args:
        tree_tokens: [B, N] int32/int64, contiguous, N >= 1: node 0 the root (its token
            is not read), the draft tokens after it (specdraft.proposers.tree_build's
            DraftTree.tokens).
        parents: [B, N] int32/int64, contiguous: parent node of each node, -1 for the
            root, parents before children (DraftTree.parents); -1 past the root marks
            a padding node, never reached (a budgeted pass's subtree ends in them).
        target_logits: [B, N, V] fp32 / bf16 / fp16, rows contiguous (any strides
            between them): row j, the target's logits for the token after node j.
        temperature: [B] fp32, contiguous (<= 0 = greedy).
        seeds: [B] int32/int64, contiguous.
        positions: [B] int32/int64, contiguous: position of the depth-1 nodes (a node
            at depth d is at positions + d - 1), the noise's counter as in
            rejection_sample.
        max_depth: Python int in [0, N - 1], default N - 1: the deepest node that can
            be accepted and the outputs' width (D); tree_build's TreeShape.depth.
        salt: Python int in [0, 2**31 - 1], default 0; part of the noise's hash.
        logit_cut: [B, N] fp32, contiguous, or None (no truncation, no extra work): the
            cut of each node's target row (ops.truncation_cut of target_logits viewed
            as [B * N, V], reshaped); a sampled request verifies against the truncated,
            renormalised rows (module docstring). Greedy requests ignore it; -inf keeps
            every token; a cut above a sampled row's largest logit keeps none (checked
            mode refuses it).

    Returns:
        AcceptedPath(nodes, tokens, counts, ranks), int32: nodes [B, D + 1] (0, then the
        accepted node at each depth, then -1); tokens [B, D + 1] (the accepted draft
        tokens, the emitted token, then -1); counts [B], accepted drafts, not
        counting the emitted token; ranks [B, D], each accepted draft's rank among its
        siblings (0 = tried first), then -1.
    """
    check_tensor_arg("tree_tokens", tree_tokens, INDEX_DTYPES, shape=(None, at_least(1, "N")), contiguous=True)
    num_reqs, num_nodes = tree_tokens.shape
    check_tensor_arg(
        "parents", parents, INDEX_DTYPES, shape=(num_reqs, num_nodes), contiguous=True, device_of=tree_tokens
    )
    check_tensor_arg(
        "target_logits", target_logits, FLOAT_DTYPES, shape=(num_reqs, num_nodes, at_least(1, "V")),
        contiguous="rows", device_of=tree_tokens,
    )  # fmt: skip
    check_request_params(num_reqs, temperature, seeds, positions, device_of=tree_tokens)
    max_depth = num_nodes - 1 if max_depth is None else max_depth
    check_int_range("max_depth", max_depth, 0, num_nodes - 1)
    check_salt(salt)
    check_logit_cut_arg(logit_cut, (num_reqs, num_nodes), target_logits)
    if is_checked():
        check_tree_verify_values(tree_tokens, parents, temperature, target_logits.shape[2], max_depth)
        if logit_cut is not None:
            check_logit_cut_values(logit_cut, target_logits, temperature)
    return AcceptedPath(
        *_tree_verify_op(tree_tokens, parents, target_logits, temperature, seeds, positions, max_depth, salt, logit_cut)
    )
