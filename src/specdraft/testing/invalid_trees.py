"""Invalid-input cases for ops.tree_verify: a valid random tree per request with one
value contract broken (the rules checked mode enforces, `check_tree_verify_values`),
in the OpCase form the other ops' cases take (specdraft.testing.invalid)."""

from hypothesis import strategies as st

from specdraft.testing.invalid import FAR, TEMPERATURE_RULES, OpCase

TREE_RULES = {
    "tree_verify": [*TEMPERATURE_RULES, "parents: root not -1", "parents: not an earlier node",
                    "tree_tokens: outside the vocabulary", "max_depth: below the tree's depth"],
}  # fmt: skip


@st.composite
def invalid_tree_cases(draw, op: str | None = None, rule: str | None = None) -> OpCase:
    """tree_verify on B <= 3 trees of N <= 8 nodes over a vocabulary of <= 32 ids."""
    op = op or "tree_verify"
    rule = rule or draw(st.sampled_from(TREE_RULES[op]))
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
        parents[b][j] = draw(st.sampled_from([j, j + draw(st.integers(1, FAR)), -1, -draw(st.integers(2, FAR))]))
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
