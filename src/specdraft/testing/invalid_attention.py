"""Invalid-input cases for ops.masked_paged_attention, in the OpCase form (op_case.py)
the other ops' cases take; specdraft.testing.invalid draws them among every op's: a
small paged cache, random queries and visibility, one slot outside the cache, the
rule checked mode enforces (`check_masked_paged_attention_values`)."""

from hypothesis import strategies as st

from specdraft.testing.op_case import FAR, OpCase

ATTENTION_RULES = {"masked_paged_attention": ["slots: negative", "slots: past the cache"]}


@st.composite
def invalid_attention_cases(draw, op: str = "masked_paged_attention", rule: str | None = None) -> OpCase:
    """B <= 3 requests of Q <= 4 queries over L <= 12 keys, 1-2 kv heads of group 1-2,
    head dim 4, a cache of 2-4 blocks of 4 slots."""
    rule = rule or draw(st.sampled_from(ATTENTION_RULES[op]))
    batch, num_queries, seq_len = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 12))
    kv_heads, group, dim, num_blocks, block_size = draw(st.integers(1, 2)), draw(st.integers(1, 2)), 4, 3, 4
    unit = st.floats(-1, 1, width=32)
    query = [[[[draw(unit) for _ in range(dim)] for _ in range(kv_heads * group)] for _ in range(num_queries)]
             for _ in range(batch)]  # fmt: skip
    cache = [[[[[draw(unit) for _ in range(dim)] for _ in range(kv_heads)] for _ in range(block_size)]
              for _ in range(num_blocks)] for _ in range(2)]  # fmt: skip
    num_slots = num_blocks * block_size
    slots = [[draw(st.integers(0, num_slots - 1)) for _ in range(seq_len)] for _ in range(batch)]
    visible = [[[draw(st.booleans()) for _ in range(seq_len)] for _ in range(num_queries)] for _ in range(batch)]
    b, i = draw(st.integers(0, batch - 1)), draw(st.integers(0, seq_len - 1))
    if rule.endswith("negative"):
        slots[b][i] = -draw(st.integers(1, FAR))
    else:
        slots[b][i] = num_slots + draw(st.integers(0, FAR))
    tensors = {"query": ("float32", query), "kv_cache": ("float32", cache), "slots": ("int64", slots),
               "visible": ("bool", visible)}  # fmt: skip
    return OpCase(op, tensors, {"scale": 0.5}, rule, "slots")
