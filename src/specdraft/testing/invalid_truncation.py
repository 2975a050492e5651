"""Invalid-input cases for ops.truncation_cut, in the OpCase form (op_case.py) the
other ops' cases take; specdraft.testing.invalid draws them among every op's: random
rows and parameters with one value contract broken, the rules checked mode enforces
(`check_truncation_cut_values`)."""

from hypothesis import strategies as st

from specdraft.testing.op_case import TEMPERATURE_RULES, OpCase

TRUNCATION_RULES = {
    "truncation_cut": [
        *TEMPERATURE_RULES,
        "top_p: not > 0",
        "top_p: past 1",
        "min_p: negative",
        "min_p: past 1",
        "min_p: NaN",
    ],  # fmt: skip
}


@st.composite
def invalid_truncation_cases(draw, op: str = "truncation_cut", rule: str | None = None) -> OpCase:
    """R <= 4 rows of V <= 24 logits, every parameter valid but one value."""
    rule = rule or draw(st.sampled_from(TRUNCATION_RULES[op]))
    rows, vocab = draw(st.integers(1, 4)), draw(st.integers(1, 24))
    logits = [[draw(st.floats(-8, 8, width=32)) for _ in range(vocab)] for _ in range(rows)]
    temperature = [draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in range(rows)]
    top_k = [draw(st.integers(-1, vocab + 1)) for _ in range(rows)]
    top_p = [draw(st.sampled_from([0.5, 0.9, 1.0])) for _ in range(rows)]
    min_p = [draw(st.sampled_from([0.0, 0.05, 0.2])) for _ in range(rows)]
    r = draw(st.integers(0, rows - 1))
    name, what = rule.split(": ")
    if name == "temperature":
        temperature[r] = {"negative": -draw(st.floats(1e-3, 1e30)), "NaN": float("nan"), "inf": float("inf")}[what]
    elif name == "top_p":
        top_p[r] = -draw(st.floats(0, 1e30)) if what == "not > 0" else 1 + draw(st.floats(1e-3, 1e30))
    else:
        bad = {"negative": -draw(st.floats(1e-3, 1e30)), "past 1": 1 + draw(st.floats(1e-3, 1e30)), "NaN": float("nan")}
        min_p[r] = bad[what]
    tensors = {
        "logits": ("float32", logits),
        "temperature": ("float32", temperature),
        "top_k": ("int32", top_k),
        "top_p": ("float32", top_p),
        "min_p": ("float32", min_p),
    }
    return OpCase(op, tensors, {}, rule, name)
