"""Invalid-input cases for the tree ops, in the OpCase form (op_case.py) the other
ops' cases take; specdraft.testing.invalid draws them among every op's:
ops.tree_verify, a valid random tree per request with one value contract broken
(the rules checked mode enforces, `check_tree_verify_values`); ops.tree_commit_kv,
moves with one slot outside the cache. (tree_select, tree_ancestors, tree_expand and
tree_positions define every value they can be given.)"""

from hypothesis import strategies as st

from specdraft.testing.op_case import FAR, TEMPERATURE_RULES, OpCase

TREE_RULES = {
    "tree_verify": [*TEMPERATURE_RULES, "parents: root not -1", "parents: not an earlier node",
                    "tree_tokens: outside the vocabulary", "max_depth: below the tree's depth"],
    "tree_commit_kv": ["src_slots: outside the cache", "dst_slots: outside the cache"],
}  # fmt: skip


@st.composite
def invalid_tree_cases(draw, op: str | None = None, rule: str | None = None) -> OpCase:
    """tree_verify on B <= 3 trees of N <= 8 nodes over a vocabulary of <= 32 ids."""
    op = op or draw(st.sampled_from(sorted(TREE_RULES)))
    rule = rule or draw(st.sampled_from(TREE_RULES[op]))
    if op == "tree_commit_kv":
        return draw(_invalid_commit_cases(rule))
    num_reqs, num_nodes, vocab = draw(st.integers(1, 3)), draw(st.integers(2, 8)), draw(st.integers(2, 32))
    parents = [[-1] + [draw(st.integers(0, j - 1)) for j in range(1, num_nodes)] for _ in range(num_reqs)]
    tokens = [[draw(st.integers(0, vocab - 1)) for _ in range(num_nodes)] for _ in range(num_reqs)]
    logits = [[[draw(st.floats(-4, 4, width=32)) for _ in range(vocab)] for _ in range(num_nodes)]
              for _ in range(num_reqs)]  # fmt: skip
    temperature = [draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in range(num_reqs)]
    b, j = draw(st.integers(0, num_reqs - 1)), draw(st.integers(1, num_nodes - 1))
    max_depth = num_nodes - 1
    if rule in TEMPERATURE_RULES:
        what = rule.split(": ")[1]
        temperature[b] = {"negative": -draw(st.floats(1e-3, 1e30)), "NaN": float("nan"), "inf": float("inf")}[what]
    elif rule == "parents: root not -1":
        parents[b][0] = draw(st.sampled_from([0, 1, -2, FAR]))
    elif rule == "parents: not an earlier node":
        parents[b][j] = draw(st.sampled_from([j, j + draw(st.integers(1, FAR)), -draw(st.integers(2, FAR))]))
    elif rule == "tree_tokens: outside the vocabulary":
        tokens[b][j] = draw(st.sampled_from([vocab + draw(st.integers(0, FAR)), -draw(st.integers(1, FAR))]))
    else:  # a tree of depth >= 1 verified with max_depth one less than its depth
        depth = [0] * num_nodes
        for i in range(1, num_nodes):
            depth[i] = depth[parents[b][i]] + 1
        max_depth = max(depth) - 1  # node 1 has depth 1, so this is >= 0
    tensors = {"tree_tokens": ("int64", tokens), "parents": ("int64", parents), "target_logits": ("float32", logits),
               "temperature": ("float32", temperature), "seeds": ("int64", list(range(num_reqs))),
               "positions": ("int64", [draw(st.integers(0, 1000)) for _ in range(num_reqs)])}  # fmt: skip
    return OpCase(op, tensors, {"max_depth": max_depth}, rule, rule.split(":")[0])


@st.composite
def _invalid_commit_cases(draw, rule: str) -> OpCase:
    """tree_commit_kv on a cache of <= 4 blocks of 4 slots, B <= 3 requests of D <= 4
    moves, one slot of one move outside [0, num_blocks * block_size)."""
    blocks, block_size, heads, dim = draw(st.integers(1, 4)), 4, draw(st.integers(1, 2)), draw(st.integers(1, 4))
    slots = blocks * block_size
    num_reqs, depth = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    moves = {name: [[draw(st.integers(0, slots - 1)) for _ in range(depth)] for _ in range(num_reqs)]
             for name in ("src_slots", "dst_slots")}  # fmt: skip
    argument = rule.split(":")[0]
    b, d = draw(st.integers(0, num_reqs - 1)), draw(st.integers(0, depth - 1))
    moves[argument][b][d] = draw(st.sampled_from([slots + draw(st.integers(0, FAR)), -draw(st.integers(1, FAR))]))
    cache = [[[[[draw(st.floats(-4, 4, width=32)) for _ in range(dim)] for _ in range(heads)]
               for _ in range(block_size)] for _ in range(blocks)] for _ in range(2)]  # fmt: skip
    tensors = {"cache": ("float32", cache), "src_slots": ("int64", moves["src_slots"]),
               "dst_slots": ("int64", moves["dst_slots"])}  # fmt: skip
    return OpCase("tree_commit_kv", tensors, {}, rule, argument, writes=("cache",))
