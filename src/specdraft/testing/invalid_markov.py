"""Invalid-input cases for ops.markov_block_sample, in the OpCase form (op_case.py)
the other ops' cases take; specdraft.testing.invalid draws them among every op's: a
random block (any Markov kind) with one value contract broken, the rules checked mode
enforces (`check_markov_block_sample_values`)."""

from hypothesis import strategies as st

from specdraft.testing.op_case import FAR, TEMPERATURE_RULES, OpCase

MARKOV_RULES = {"markov_block_sample": [*TEMPERATURE_RULES, "first_prev_tokens: outside the vocabulary"]}


@st.composite
def invalid_markov_cases(draw, op: str = "markov_block_sample", rule: str | None = None) -> OpCase:
    """B <= 3 requests, S <= 4 steps, V <= 24 tokens, rank <= 4, hidden part and latent
    weight shaped for the drawn kind."""
    rule = rule or draw(st.sampled_from(MARKOV_RULES[op]))
    kind = draw(st.sampled_from(["vanilla", "gated", "rnn"]))
    num_reqs, num_steps = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    vocab, rank = draw(st.integers(1, 24)), draw(st.integers(1, 4))

    def values(*shape):
        if len(shape) == 1:
            return [draw(st.floats(-2, 2, width=32)) for _ in range(shape[0])]
        return [values(*shape[1:]) for _ in range(shape[0])]

    temperature = [draw(st.sampled_from([0.0, 0.5, 1.0])) for _ in range(num_reqs)]
    first = [draw(st.integers(0, vocab - 1)) for _ in range(num_reqs)]
    b = draw(st.integers(0, num_reqs - 1))
    if rule in TEMPERATURE_RULES:
        what = rule.split(": ")[1]
        temperature[b] = {"negative": -draw(st.floats(1e-3, 1e30)), "NaN": float("nan"), "inf": float("inf")}[what]
    else:
        first[b] = draw(st.sampled_from([vocab + draw(st.integers(0, FAR)), -draw(st.integers(1, FAR))]))
    tensors = {
        "base_logits": ("float32", values(num_reqs, num_steps, vocab)),
        "first_prev_tokens": ("int64", first),
        "markov_w1": ("float32", values(vocab, rank)),
        "markov_w2": ("float32", values(vocab, rank)),
        "temperature": ("float32", temperature),
        "seeds": ("int64", [draw(st.integers(0, 2**20)) for _ in range(num_reqs)]),
        "positions": ("int64", [draw(st.integers(0, 1 << 16)) for _ in range(num_reqs)]),
    }
    if kind != "vanilla":
        outputs, inputs = (rank, rank) if kind == "gated" else (3 * rank, 2 * rank)
        tensors |= {"hidden_part": ("float32", values(num_reqs, num_steps, outputs)),
                    "latent_weight": ("float32", values(outputs, inputs))}  # fmt: skip
    return OpCase(op, tensors, {"kind": kind}, rule, rule.split(":")[0])
