"""Invalid-input cases for ops.budget_keep, in the OpCase form (op_case.py) the other
ops' cases take; specdraft.testing.invalid draws them among every op's: a random
batch of values (eligible, zero, negative, NaN) with one depth outside [0, N], the
rule checked mode enforces (`check_budget_keep_values`)."""

from hypothesis import strategies as st

from specdraft.testing.op_case import FAR, OpCase

BUDGET_RULES = {"budget_keep": ["depths: negative", "depths: past N"]}


@st.composite
def invalid_budget_cases(draw, op: str = "budget_keep", rule: str | None = None) -> OpCase:
    """B <= 4 requests of N <= 8 positions, chain depths, any budget."""
    rule = rule or draw(st.sampled_from(BUDGET_RULES[op]))
    num_reqs, num_pos = draw(st.integers(1, 4)), draw(st.integers(1, 8))
    value = st.one_of(st.floats(0, 1, width=32), st.sampled_from([0.0, -1.0, float("nan")]))
    values = [[draw(value) for _ in range(num_pos)] for _ in range(num_reqs)]
    depths = [list(range(num_pos)) for _ in range(num_reqs)]
    b, i = draw(st.integers(0, num_reqs - 1)), draw(st.integers(0, num_pos - 1))
    if rule.endswith("negative"):
        depths[b][i] = -draw(st.integers(1, FAR))
    else:
        depths[b][i] = num_pos + draw(st.integers(1, FAR))
    budget = draw(st.integers(-FAR, FAR))
    tensors = {"values": ("float32", values), "depths": ("int64", depths), "budget": ("int64", budget)}
    return OpCase(op, tensors, {}, rule, "depths")
