"""Speculative decoding with EAGLE-2 draft trees: one iteration is

    verify_tree   the target over the N tree nodes of every request (ancestor mask, paged KV)
    walk          the longest root-to-leaf path the target agrees with, and the bonus token after it
    commit        the path's KV moved to the slots a chain would have written; the state's commit
    draft         propose_tree over the accepted path (padded to path_depth + 1 rows)

all tensors, static in (B, depth, topk, N), no host sync: `torch.compile(decoder.iteration,
fullgraph=True)` traces it whole, as for chains (decoder.py).

KV layout. Between iterations a request's target cache holds its first `lens` tokens.
A verify pass writes node i's KV at sequence index lens + i (node order: parents
first, by depth). The accepted path's node at depth d (d = 1 .. accepted) moves from
lens + its index to lens + d, so the cache holds exactly what a chain of those
tokens would have written; rejected nodes' KV lies past the new lens, where nothing
reads it and the next pass overwrites it. The draft's cache needs no move: its first
pass rewrites the path's positions.

Reach. A tree of N nodes goes at most N - 1 deep, so an accepted path has at most
path_depth = min(depth, N - 1) nodes below the root, and the draft's window holds
path_depth + 1 rows at lens .. lens + path_depth. Both passes stay within N - 1
positions past a request's length, which is what the block table reserves
(num_kv_blocks with N - 1); a window of depth + 1 rows would not when depth > N - 1
(e.g. TreeShape(8, 2, 2)): near max_model_len its rows past the table would land
on the request's last block, over its own draft KV.

Under a budget (tree_budget.py) the verify pass takes each request's kept subtree
only, renumbered and packed; the walk, the KV move and the draft pass are the same
over it.

Greedy verification is lossless: the emitted tokens are the target's argmax chain
(every accepted node equals the target's argmax at its parent; the bonus token is
the argmax at the deepest accepted node), so the output is target-only greedy
decoding token for token (tests/generation/test_tree_greedy.py). Sampled
verification (ops.tree_verify: siblings tried in draft order, each accepted with its
share of the target's residual mass, rejected ones removed from it) emits tokens
distributed as target-only sampling (tests/generation/test_tree_sampling.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from specdraft.ops import tree_commit_kv, tree_verify
from specdraft.proposers import Proposer
from specdraft.proposers.tree_build import TreeShape, check_tree_shape

from . import checks
from .decoder import SpeculativeDecoder, Verified
from .state import DecodeState, Requests, commit
from .tree_budget import check_tree_budget, has_kept_child, kept_nodes, pack_tree
from .tree_costs import PLAIN, TreeCosts
from .verify import slots_of, target_cut, tree_batch, window_batch


@dataclass
class TreeDecodeState(DecodeState):
    """DecodeState with a tree instead of a chain: drafts [B, N - 1] are the tree's
    nodes 1 .. N - 1 (node 0, the root, is last_tokens); tree_parents / tree_depths
    [B, N] int64 (tree_build.DraftTree's); accepted [depth] counts passes per accepted
    depth; sibling_ranks [topk] int64 counts accepted nodes by their rank among their
    siblings (0: the draft's likeliest child); survival [B, N] fp32 under a budget:
    each node's path probability under the draft (tree_budget.py), None without."""

    tree_parents: torch.Tensor | None = None
    tree_depths: torch.Tensor | None = None
    sibling_ranks: torch.Tensor | None = None


class TreeWalk(NamedTuple):
    path: torch.Tensor  # [B, depth + 1] int64: node index at each depth of the accepted path (0 past it)
    counts: torch.Tensor  # [B] int64: accepted drafts (the path's depth)
    tokens: torch.Tensor  # [B, depth + 1] int32: the accepted drafts, the bonus token, then -1
    accepted: torch.Tensor  # [B, N] bool: nodes on the accepted path (the root included)


def greedy_walk(target: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                ancestors: torch.Tensor, depth: int) -> TreeWalk:  # fmt: skip
    """Greedy tree verification. target [B, N] the target's argmax at every node (of
    its logits; ties: the lowest id); a node is accepted when it and every ancestor
    equal the target's argmax at their parent. Siblings are distinct tokens, so the
    accepted nodes form one path from the root. Node 0 is the root; a padding node
    (token -1, a budgeted subtree's) never matches."""
    nodes = torch.arange(tokens.shape[1], device=target.device)
    match = (nodes == 0) | (tokens.long() == target.gather(1, parents.clamp(min=0)))
    accepted = ~(ancestors & ~match[:, None, :]).any(dim=-1)
    counts = torch.where(accepted, depths, 0).amax(dim=1)
    levels = torch.arange(depth + 1, device=target.device)
    at_level = accepted[:, :, None] & (depths[:, :, None] == levels)  # [B, N, depth + 1]
    path = (at_level.long() * nodes[None, :, None]).sum(dim=1)
    bonus = target.gather(1, path.gather(1, counts[:, None]))[:, 0]
    drafted = tokens.long().gather(1, path[:, 1:])  # [B, depth]: the path's tokens below the root
    emitted = torch.cat([drafted, drafted[:, :1]], dim=1)
    emitted = torch.where(levels < counts[:, None], emitted, torch.where(levels == counts[:, None], bonus[:, None], -1))
    return TreeWalk(path, counts, emitted.to(torch.int32), accepted)


def sampled_walk(logits, tokens, parents, requests: Requests, first_positions, depth: int) -> TreeWalk:
    """Tree verification by ops.tree_verify (greedy rows greedy, sampled rows by its
    lossless multi-candidate rule; noise keyed by each request's seed and the
    positions from first_positions, the depth-1 nodes' position), as a TreeWalk of
    depth + 1 columns. A request's top-k / top-p / min-p truncate every node's target
    distribution (verify.target_cut); the tree's top-k drafts need none."""
    n = tokens.shape[1]
    reach = min(depth, n - 1)  # a tree of N nodes goes at most N - 1 deep
    sampling = requests.sampling
    out = tree_verify(tokens.contiguous(), parents.contiguous(), logits, sampling.temperature.contiguous(),
                      sampling.seeds.contiguous(), first_positions.contiguous(), max_depth=reach,
                      logit_cut=target_cut(logits, sampling))  # fmt: skip
    nodes = F.pad(out.nodes.long(), (0, depth - reach), value=-1)
    emitted = F.pad(out.tokens, (0, depth - reach), value=-1)
    on_path = (nodes[:, :, None] == torch.arange(n, device=tokens.device)).any(dim=1)
    return TreeWalk(nodes.clamp(min=0), out.counts.long(), emitted, on_path)


def move_path_kv(caches, path, counts, lens, block_table, block_size: int) -> None:
    """Each cache's KV of the accepted path's node at depth d (index path[d], at
    sequence index lens + path[d]) moved to lens + d, for d = 1 .. counts, by
    ops.tree_commit_kv (every layer's cache in one call; every source is read before a
    destination is written, so an earlier depth's source may be a later depth's
    destination); other depths move a slot onto itself."""
    depth = path.shape[1] - 1
    levels = torch.arange(1, depth + 1, device=path.device)
    moved = levels[None, :] <= counts[:, None]
    rows = torch.arange(path.shape[0], device=path.device)[:, None].expand(-1, depth)
    src = slots_of(lens[:, None] + torch.where(moved, path[:, 1:], levels), rows, block_table, block_size)
    dst = slots_of(lens[:, None] + levels, rows, block_table, block_size)
    tree_commit_kv(caches, src.contiguous(), dst.contiguous())


def sibling_rank(parents: torch.Tensor) -> torch.Tensor:
    """[B, N]: each node's rank among its siblings (nodes are laid out in the draft's
    order within a parent: the rank among its children by draft probability)."""
    n = parents.shape[1]
    earlier = torch.arange(n, device=parents.device)[None, :] < torch.arange(n, device=parents.device)[:, None]
    return ((parents[:, :, None] == parents[:, None, :]) & earlier[None]).sum(dim=-1)


class TreeSpeculativeDecoder(SpeculativeDecoder):
    """SpeculativeDecoder with EAGLE-2 draft trees (module docstring): `tree` is a
    TreeShape (depth, topk, num_verify_tokens); `proposer` an EagleProposer with an
    EAGLE-1 or EAGLE-3 head, or an AutoregressiveSpeculator (a standalone draft LM,
    whose window pass rewrites the accepted path's draft KV as an EAGLE head's first
    pass does). The KV caches (target and draft) need
    num_kv_blocks(B, max_model_len, num_verify_tokens - 1, block_size) blocks: a verify
    pass writes N nodes from a request's length on, a draft pass at most as many
    (module docstring: Reach). An all-greedy batch verifies by the
    greedy walk; any other by ops.tree_verify, whose sampled rule is lossless for the
    tree's deterministic (top-k) drafts. The drafts are the same at any temperature.

    budget: None (every node verified) or an int >= 0, the most tree nodes below the
    roots verified per iteration over the whole batch: each iteration keeps the nodes
    of best path probability, every request a subtree of its tree, and verifies them
    in a pass of B + min(budget, B * (N - 1)) rows (generation/tree_budget.py); 0
    decodes plainly (no draft pass). Or a TreeCosts table measured with this tree
    (generation/tree_costs.py): each run takes the budget (the whole tree, none, or
    n nodes) that measured the most tokens per second at its batch size. A StepCosts
    table and calibration are refused (chains and block drafters only)."""

    def __init__(self, target: torch.nn.Module, proposer, tree: TreeShape, *, budget: int | None = None,
                 **kwargs) -> None:  # fmt: skip
        check_tree_shape("tree", tree)
        budget = check_tree_budget(budget, kwargs.get("calibration"), tree)
        if not (isinstance(proposer, Proposer) and proposer.drafts_trees):
            got = type(proposer).__name__
            if isinstance(proposer, Proposer):
                got += f" with method {proposer.config.method!r}"
            raise ValueError(f"proposer: draft trees need an EagleProposer with an EAGLE-1 or EAGLE-3 head, or an "
                             f"AutoregressiveSpeculator; got {got}")  # fmt: skip
        self.tree = tree
        super().__init__(target, proposer, **kwargs)
        # Nodes below the roots verified per iteration (tree_budget.py); a TreeCosts
        # table sets it per run (generate).
        self.budget_policy = budget
        self.budget = None if isinstance(budget, TreeCosts) else budget
        self.k = tree.depth  # the statistics' positions: one per tree depth
        self.path_depth = min(tree.depth, tree.num_verify_tokens - 1)  # accepted drafts per pass, at most
        # The verify pass writes N - 1 positions past a request's length, the draft's
        # window path_depth <= N - 1 (module docstring: Reach).
        self.blocks_per_request = checks.blocks_per_request(self.max_model_len, tree.num_verify_tokens - 1,
                                                            self.block_size)  # fmt: skip
        self.reach = self.blocks_per_request * self.block_size

    def generate(self, prompts, **kwargs):
        """SpeculativeDecoder.generate, under a TreeCosts table with this run's budget
        (`self.budget` says which it took; `self.proposer` is None where it took plain
        decoding)."""
        if isinstance(self.budget_policy, TreeCosts):
            self.take_tree_budget(self.budget_policy.choose(len(prompts)))
        return super().generate(prompts, **kwargs)

    def take_tree_budget(self, budget: int | None) -> None:
        """A TreeCosts choice for the next run. PLAIN runs as plain decoding: no
        proposer for the run, so no draft prefill, no aux layers and no packing (the
        tree iteration at budget 0 ran all three: 27% slower than plain decoding at B =
        1 on an H200); any other budget runs the tree under it (None: every node)."""
        plain = budget == PLAIN
        self.proposer = None if plain else self.full_proposer
        self.k = 0 if plain else self.tree.depth
        self.budget = None if plain else budget

    # ------------------------------------------------------------------ drafting

    def draft_after_prefill(self, state: DecodeState, token_ids, positions, draft_hidden, metadata, requests):
        out = self.proposer.propose_tree(token_ids, positions, draft_hidden, state.last_tokens, metadata, self.tree)
        return self.with_tree(state, out.tree, torch.zeros(self.tree.topk, dtype=torch.int64,
                                                           device=state.lens.device))  # fmt: skip

    def with_tree(self, state: DecodeState, tree, sibling_ranks) -> TreeDecodeState:
        """The state carrying `tree` as its drafts (a TreeDecodeState made from the
        prefill's DecodeState eagerly; inside the compiled iteration, a replace), and
        under a budget its nodes' path probabilities as their survival estimates."""
        drafts = tree.tokens[:, 1:].to(torch.int32).contiguous()
        survival = None if self.budget is None else tree.scores.float().exp()
        tree_fields = {"drafts": drafts, "survival": survival, "tree_parents": tree.parents,
                       "tree_depths": tree.depths, "sibling_ranks": sibling_ranks}  # fmt: skip
        if isinstance(state, TreeDecodeState):
            return dataclasses.replace(state, **tree_fields)
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(DecodeState)}
        return TreeDecodeState(**(fields | tree_fields))

    def draft(self, state: TreeDecodeState, verified: Verified, requests: Requests) -> TreeDecodeState:
        """propose_tree over each request's accepted path: rows 0 .. counts are the
        root and the accepted nodes, the rest of the path_depth + 1 rows padding
        (num_rejected_tokens); the bonus token is the next token."""
        if self.proposer is None or self.budget == 0:  # nothing is ever verified: no draft pass
            return state
        width = self.path_depth + 1
        _, metadata = window_batch(verified.lens, width, requests.block_table, self.block_size, self.reach)
        rows = torch.arange(verified.lens.shape[0], device=verified.lens.device) * width
        bonus = verified.sampled.gather(1, verified.counts[:, None])[:, 0]
        out = self.proposer.propose_tree(
            verified.token_ids, verified.positions, verified.hidden_states, bonus, metadata, self.tree,
            token_indices_to_sample=(rows + verified.counts).to(torch.int32),
            num_rejected_tokens=(self.path_depth - verified.counts).to(torch.int32),
        )  # fmt: skip
        return self.with_tree(state, out.tree, state.sibling_ranks)

    # ------------------------------------------------------------------ verifying

    def verify(self, state: TreeDecodeState, requests: Requests) -> tuple[TreeDecodeState, Verified]:
        """The target over every request's tree, the walk, the KV move and the commit
        (under a budget, `verify_budgeted`)."""
        if self.proposer is None:  # a TreeCosts table's plain decoding: the chain's pass over one token
            return super().verify(state, requests)
        if self.budget is not None:
            return self.verify_budgeted(state, requests)
        n = self.tree.num_verify_tokens
        num_reqs, device = state.lens.shape[0], state.lens.device
        tokens = torch.cat([state.last_tokens[:, None], state.drafts], dim=1)  # [B, N]
        positions, metadata = tree_batch(state.lens, state.tree_parents, state.tree_depths, requests.block_table,
                                         self.block_size, self.reach, self.max_model_len)  # fmt: skip
        hidden, draft_hidden = self.run_target(tokens.reshape(-1).to(torch.int32), positions.reshape(-1), metadata)
        logits = self.target.compute_logits(hidden).view(num_reqs, n, -1)
        if requests.all_greedy:  # as chains do: no noise or softmax in an all-greedy graph
            walk = greedy_walk(logits.argmax(dim=-1), tokens, state.tree_parents, state.tree_depths,
                               metadata.ancestors, self.tree.depth)  # fmt: skip
        else:
            walk = sampled_walk(logits, tokens, state.tree_parents, requests, state.lens + 1, self.tree.depth)
        rows = torch.arange(num_reqs * n, device=device).view(num_reqs, n)
        committed = commit(state, walk.tokens, walk.counts.to(torch.int32), requests)
        return self.after_walk(state, committed, requests, walk, tokens, rows, draft_hidden, walk.accepted)

    def verify_budgeted(self, state: TreeDecodeState, requests: Requests) -> tuple[TreeDecodeState, Verified]:
        """The target over each request's kept subtree, packed into B + min(budget,
        B * (N - 1)) rows (generation/tree_budget.py), the walk over the subtrees, the
        KV move and the commit."""
        n = self.tree.num_verify_tokens
        num_reqs = state.lens.shape[0]
        tokens = torch.cat([state.last_tokens[:, None], state.drafts], dim=1)  # [B, N]
        kept = kept_nodes(state.survival, state.tree_parents, state.tree_depths, state.done, requests.budget,
                          self.tree.depth)  # fmt: skip
        num_rows = num_reqs + min(self.budget, num_reqs * (n - 1))
        packed = pack_tree(tokens, state.tree_parents, state.tree_depths, kept, state.lens, num_rows,
                           requests.block_table, self.block_size, self.reach, self.max_model_len)  # fmt: skip
        hidden, draft_hidden = self.run_target(packed.token_ids, packed.positions, packed.metadata)
        logits = self.target.compute_logits(hidden)  # [T, V]
        if requests.all_greedy:  # the argmax of the packed rows, then per subtree node
            target = logits.argmax(dim=-1).index_select(0, packed.rows.reshape(-1)).view(num_reqs, n)
            walk = greedy_walk(target, packed.tokens, packed.parents, packed.depths, packed.metadata.ancestors,
                               self.tree.depth)  # fmt: skip
        else:
            per_node = logits.index_select(0, packed.rows.reshape(-1)).view(num_reqs, n, -1)
            walk = sampled_walk(per_node, packed.tokens, packed.parents, requests, state.lens + 1, self.tree.depth)
        committed = commit(state, walk.tokens, walk.counts.to(torch.int32), requests, packed.num_drafts)
        # A depth was tested where the accepted path reached it and its node there had a kept child.
        levels = torch.arange(self.tree.depth, device=state.lens.device)
        tested = (~state.done)[:, None] & (walk.counts[:, None] >= levels)
        tested = tested & has_kept_child(packed.parents).gather(1, walk.path[:, : self.tree.depth])
        committed = dataclasses.replace(committed, tested=state.tested + tested.long().sum(dim=0))
        accepted = packed.kept & walk.accepted.gather(1, packed.local)  # on the draft tree's nodes
        return self.after_walk(state, committed, requests, walk, packed.tokens, packed.rows, draft_hidden, accepted)

    def after_walk(self, state: TreeDecodeState, committed: TreeDecodeState, requests: Requests, walk: TreeWalk,
                   tokens, rows, draft_hidden, accepted) -> tuple[TreeDecodeState, Verified]:  # fmt: skip
        """The accepted path's KV moved, the sibling-rank statistics (accepted [B, N]:
        the draft tree's nodes on the path) and what the draft pass reads: tokens [B,
        N] the nodes the walk ran over, rows [B, N] their rows of draft_hidden."""
        device = state.lens.device
        move_path_kv(self.target_kv_caches, walk.path, walk.counts, state.lens, requests.block_table, self.block_size)
        ranks = sibling_rank(state.tree_parents)
        counted = accepted & (state.tree_parents >= 0) & (~state.done)[:, None]
        rank_counts = torch.zeros_like(state.sibling_ranks).index_add_(
            0, ranks.reshape(-1).clamp(max=self.tree.topk - 1), counted.reshape(-1).long()
        )
        committed = dataclasses.replace(committed, sibling_ranks=state.sibling_ranks + rank_counts)
        width = self.path_depth + 1
        path = walk.path[:, :width]  # the columns past path_depth are always the root (0): no path goes deeper
        verified = Verified(
            token_ids=tokens.gather(1, path).reshape(-1).to(torch.int32),
            positions=(state.lens[:, None] + torch.arange(width, device=device)).reshape(-1),
            hidden_states=draft_hidden.index_select(0, rows.gather(1, path).reshape(-1)),
            sampled=walk.tokens[:, :width],  # the bonus token sits at counts <= path_depth
            counts=walk.counts,
            lens=state.lens,
            last_tokens=state.last_tokens,
            done=state.done,
        )
        return committed, verified
