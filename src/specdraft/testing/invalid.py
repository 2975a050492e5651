"""Hypothesis strategies of *invalid* op inputs, each tagged with the one rule it
breaks, so that an engine can fuzz its own error handling against specdraft's.

Every case is a valid layout from the strategies beside this module (shift_layouts,
step_layouts, rejection_layouts, expand_layouts, sampling_batches) with exactly one
rule broken. `OpCase.rule` says which ("query_start_loc: decreasing"), and
`OpCase.argument` is the argument checked mode names for it: under
`specdraft.checked()` the op raises a ValueError whose message starts with that
name. Without checked mode the op must run anyway, reading and writing nothing
outside its tensors: `OpCase.run(device, guard=g)` places every buffer the op
writes inside a larger one with g sentinel rows on each side and reports whether
they survived (op_case.py). The tree ops' cases: invalid_trees.py;
markov_block_sample's: invalid_markov.py; budget_keep's: invalid_budget.py;
masked_paged_attention's: invalid_attention.py;
truncation_cut's: invalid_truncation.py; proposer-level cases: invalid_batches.py.

Values reach far outside the valid ranges now and then (up to 2**30), so that
index arithmetic overflowing or skipping a mask shows.
"""

from hypothesis import strategies as st

from specdraft.testing.batch import rejection_layouts, step_layouts
from specdraft.testing.expand import expand_layouts
from specdraft.testing.invalid_attention import ATTENTION_RULES, invalid_attention_cases
from specdraft.testing.invalid_budget import BUDGET_RULES, invalid_budget_cases
from specdraft.testing.invalid_markov import MARKOV_RULES, invalid_markov_cases
from specdraft.testing.invalid_trees import TREE_RULES, invalid_tree_cases
from specdraft.testing.invalid_truncation import TRUNCATION_RULES, invalid_truncation_cases
from specdraft.testing.op_case import FAR, TEMPERATURE_RULES, OpCase
from specdraft.testing.sampling import sampling_batches
from specdraft.testing.shift_and_cache import shift_layouts

HIDDEN = 8  # hidden size of the shift_and_cache_hidden cases


def _int(draw, low: int, high: int) -> int:
    """Mostly near the bound, now and then far past it."""
    return draw(st.one_of(st.integers(low, high), st.just(high), st.integers(low, max(low, min(high, FAR)))))


# ------------------------------------------------------------ breaking query_start_loc

WINDOW_RULES = [
    "query_start_loc: not from 0",
    "query_start_loc: decreasing",
    "query_start_loc: past the tokens",
    "query_start_loc: empty window",
]


def break_windows(draw, qsl: list[int], num_tokens: int, rule: str) -> list[int]:
    """A copy of qsl (B >= 1) with one of WINDOW_RULES broken (the rule's text after
    its argument name is what counts, so other names for qsl work too)."""
    qsl = list(qsl)
    what = rule.split(": ")[1]
    b = draw(st.integers(0, len(qsl) - 2))
    if what == "not from 0":
        qsl[0] = -_int(draw, 1, FAR)
    elif what == "decreasing":
        qsl[b + 1] = qsl[b] - _int(draw, 1, FAR)
    elif what == "past the tokens":
        qsl[-1] = num_tokens + _int(draw, 1, FAR)
    elif what == "empty window":
        qsl[b + 1] = qsl[b]
        for i in range(b + 2, len(qsl)):
            qsl[i] = max(qsl[i], qsl[b])
    else:
        raise ValueError(f"rule: not a window rule, {rule!r}")
    return qsl


# ------------------------------------------------------------------ the shift ops


SHIFT_RULES = {
    "shift_and_cache_1d": [*WINDOW_RULES[:3], "token_indices_to_sample: outside its window",
                           "cached_lens: past max_shift", "shift: past cached_lens"],
    "shift_plan": [*WINDOW_RULES[:3], "token_indices_to_sample: outside its window", "cached_lens: past max_shift",
                   "seq_lens: shorter than the window"],
}  # fmt: skip
SHIFT_RULES["shift_and_cache_hidden"] = SHIFT_RULES["shift_and_cache_1d"]


@st.composite
def invalid_shift_cases(draw, op: str | None = None, rule: str | None = None) -> OpCase:
    """shift_and_cache_1d / shift_and_cache_hidden / shift_plan with one rule broken."""
    op = op or draw(st.sampled_from(sorted(SHIFT_RULES)))
    rule = rule or draw(st.sampled_from(SHIFT_RULES[op]))
    # A rule about one request's window needs a non-empty one.
    layout = draw(shift_layouts(max_requests=4, max_window=300).filter(lambda lay: any(lay.window_lens)))
    qsl, samples = list(layout.query_start_loc), list(layout.token_indices_to_sample)
    shift, cached, seq_lens = list(layout.shift), list(layout.cached_lens), list(layout.seq_lens)
    if op == "shift_plan":  # its sample index is before the shift: any row of the window
        samples = [draw(st.integers(q, q + n - 1)) if n else s
                   for q, n, s in zip(qsl, layout.window_lens, samples, strict=False)]  # fmt: skip
    b = draw(st.sampled_from([b for b, n in enumerate(layout.window_lens) if n > 0]))
    if rule in WINDOW_RULES:
        qsl = break_windows(draw, qsl, layout.num_tokens, rule)
    elif rule.startswith("cached_lens"):
        cached[b] = layout.max_shift + _int(draw, 1, FAR)
    elif rule.startswith("token_indices"):
        samples[b] = draw(st.sampled_from([qsl[b] - _int(draw, 1, FAR), qsl[b + 1] + _int(draw, 0, FAR)]))
    elif rule.startswith("seq_lens"):
        seq_lens[b] = layout.window_lens[b] - _int(draw, 1, FAR)
    else:
        shift[b] = cached[b] + _int(draw, 1, FAR)
    argument = rule.split(":")[0]
    index = {"query_start_loc": ("int32", qsl), "token_indices_to_sample": ("int32", samples),
             "cached_lens": ("int32", cached)}  # fmt: skip
    positions = layout.positions()
    if op == "shift_plan":
        tensors = {**index, "positions": ("int64", positions), "seq_lens": ("int32", seq_lens)}
        return OpCase(op, tensors, {"max_shift": layout.max_shift}, rule, argument)
    num_reqs, m = layout.num_reqs, layout.max_shift
    if op == "shift_and_cache_1d":
        src, cache = positions, [[7 * r + i for i in range(m)] for r in range(num_reqs)]
        kinds = "int64"
    else:
        src = [[float(t + h / 8) for h in range(HIDDEN)] for t in range(layout.num_tokens)]
        cache = [[[float(-r - i / 8)] * HIDDEN for i in range(m)] for r in range(num_reqs)]
        kinds = "float32"
    tensors = {"src": (kinds, src), "dst": (kinds, src), "cache": (kinds, cache), **index, "shift": ("int32", shift)}
    return OpCase(op, tensors, {"max_query_len": layout.max_query_len}, rule, argument, ("dst", "cache"))


# -------------------------------------------------------------- step_metadata

STEP_RULES = {
    "step_metadata": ["positions: negative", "seq_lens: below 1", "block_table: negative block id",
                      "block_table: a written block shared"],
}  # fmt: skip


@st.composite
def invalid_step_cases(draw, op: str = "step_metadata", rule: str | None = None) -> OpCase:
    rule = rule or draw(st.sampled_from(STEP_RULES[op]))
    shared = rule.endswith("shared")
    layout = draw(step_layouts(mrope=False).filter(
        lambda lay: lay.num_reqs >= (2 if shared else 1)
        and (not shared or any(p + 1 < lay.max_model_len for p in lay.positions))))  # fmt: skip
    positions, seq_lens = list(layout.positions), list(layout.seq_lens)
    table = [list(row) for row in layout.block_table]
    writing = [b for b, p in enumerate(positions) if p + 1 < layout.max_model_len]
    b = draw(st.sampled_from(writing if shared else range(layout.num_reqs)))
    if rule.startswith("positions"):
        positions[b] = -_int(draw, 2, FAR)  # -1 would advance to a valid 0
    elif rule.startswith("seq_lens"):
        seq_lens[b] = -_int(draw, 0, FAR)
    elif rule.endswith("negative block id"):
        table[b][draw(st.integers(0, len(table[b]) - 1))] = -_int(draw, 1, FAR)
    else:
        new = positions[b] + 1
        written = table[b][min(new // layout.block_size, len(table[b]) - 1)]
        other = draw(st.sampled_from([c for c in range(layout.num_reqs) if c != b]))
        table[other][draw(st.integers(0, len(table[other]) - 1))] = written
    tensors = {
        "positions": ("int64", positions),
        "seq_lens": ("int32", seq_lens),
        "block_table": ("int32", table),
        "slot_mapping": ("int64", [0] * layout.num_slots),
        "clamped_positions": ("int64", [0] * layout.num_reqs),
    }
    scalars = {"block_size": layout.block_size, "max_model_len": layout.max_model_len}
    writes = ("positions", "seq_lens", "slot_mapping", "clamped_positions")
    return OpCase(op, tensors, scalars, rule, rule.split(":")[0], writes)


# ------------------------------------------------------------ batch preparation

PREPARE_RULES = {
    "prepare_eagle_input": ["num_rejected_tokens: past the window", "num_rejected_tokens: negative",
                            "cu_target_query_lens: not from 0", "cu_target_query_lens: decreasing"],
    "prepare_inputs_padded": ["cu_num_draft_tokens: more drafts than the window", "cu_num_draft_tokens: decreasing",
                              "valid_sampled_tokens_count: past drafts + 1", *WINDOW_RULES[:2]],
    "prepare_next_token_padded": ["backup_next_token_ids: outside the vocabulary"],
}  # fmt: skip


@st.composite
def invalid_prepare_cases(draw, op: str | None = None, rule: str | None = None) -> OpCase:
    """prepare_eagle_input / prepare_inputs_padded / prepare_next_token_padded."""
    op = op or draw(st.sampled_from(sorted(PREPARE_RULES)))
    rule = rule or draw(st.sampled_from(PREPARE_RULES[op]))
    layout = draw(rejection_layouts(max_requests=6, max_prefill=40).filter(lambda lay: lay.num_reqs >= 1))
    qsl, lens = layout.query_start_loc, layout.query_lens
    b = draw(st.integers(0, layout.num_reqs - 1))
    argument = rule.split(":")[0]
    if rule.endswith(("not from 0", "decreasing")) and argument in ("query_start_loc", "cu_target_query_lens"):
        qsl = break_windows(draw, qsl, sum(lens), rule)
    if op == "prepare_eagle_input":
        rejected = list(layout.num_rejected_tokens)
        if rule.endswith("past the window"):
            rejected[b] = lens[b] + _int(draw, 1, FAR)
        elif rule.endswith("negative"):
            rejected[b] = -_int(draw, 1, FAR)
        tensors = {"cu_target_query_lens": ("int32", qsl), "num_rejected_tokens": ("int32", rejected)}
        return OpCase(op, tensors, {"num_tokens": sum(lens)}, rule, argument)
    if op == "prepare_inputs_padded":
        cu, valid = list(layout.cu_num_draft_tokens), list(layout.valid_counts)
        drafts = cu[b] - (cu[b - 1] if b else 0)
        if rule.endswith("more drafts than the window"):  # request b: at least its window
            cu = [c + (lens[b] + _int(draw, 0, FAR // 64) if i >= b else 0) for i, c in enumerate(cu)]
        elif rule == "cu_num_draft_tokens: decreasing":  # request b: a negative count
            drop = drafts + _int(draw, 1, FAR // 64)
            cu = [c - (drop if i >= b else 0) for i, c in enumerate(cu)]
        elif argument == "valid_sampled_tokens_count":
            valid[b] = drafts + 1 + _int(draw, 1, FAR)
        tensors = {"cu_num_draft_tokens": ("int32", cu), "valid_sampled_tokens_count": ("int32", valid),
                   "query_start_loc": ("int32", qsl)}  # fmt: skip
        return OpCase(op, tensors, {}, rule, argument)
    vocab = draw(st.integers(1, 100))
    width = draw(st.integers(1, 5))
    sampled = [[draw(st.integers(-1, vocab + 2)) for _ in range(width)] for _ in range(layout.num_reqs)]
    backup = [draw(st.integers(0, vocab - 1)) for _ in range(layout.num_reqs)]
    backup[b] = draw(st.sampled_from([vocab + _int(draw, 0, FAR), -_int(draw, 1, FAR)]))
    tensors = {"sampled_token_ids": ("int32", sampled), "discard_request_mask": ("bool", [False] * layout.num_reqs),
               "backup_next_token_ids": ("int32", backup)}  # fmt: skip
    return OpCase(op, tensors, {"vocab_size": vocab}, rule, argument)


# ------------------------------------------------------------ parallel drafting

EXPAND_RULES = {
    "copy_and_expand_inputs": [*WINDOW_RULES, "num_rejected_tokens: the whole window", "num_rejected_tokens: negative"],
    "new_slot_mapping": [*WINDOW_RULES[:3], "positions: negative", "block_table: negative block id"],
    "extend_queries_by_n": [*WINDOW_RULES[:2], "seq_lens: shorter than the window"],
}  # fmt: skip


@st.composite
def invalid_expand_cases(draw, op: str | None = None, rule: str | None = None) -> OpCase:
    """copy_and_expand_inputs / new_slot_mapping / extend_queries_by_n."""
    op = op or draw(st.sampled_from(sorted(EXPAND_RULES)))
    rule = rule or draw(st.sampled_from(EXPAND_RULES[op]))
    layout = draw(expand_layouts(max_requests=4, max_prefill=100).filter(lambda lay: lay.num_reqs >= 1))
    qsl, lens, num_tokens = list(layout.query_start_loc), layout.window_lens, layout.num_tokens
    b = draw(st.integers(0, layout.num_reqs - 1))
    positions, argument = layout.positions(), rule.split(":")[0]
    if rule in WINDOW_RULES:
        qsl = break_windows(draw, qsl, num_tokens, rule)
    if op == "copy_and_expand_inputs":
        rejected = list(layout.num_rejected)
        if rule.endswith("the whole window"):
            rejected[b] = lens[b] + _int(draw, 0, FAR)
        elif rule.endswith("negative"):
            rejected[b] = -_int(draw, 1, FAR)
        tensors = {
            "target_token_ids": ("int32", [t % 1000 for t in range(num_tokens)]),
            "target_positions": ("int64", positions),
            "next_token_ids": ("int32", list(range(layout.num_reqs))),
            "query_start_loc": ("int32", qsl),
            "num_rejected_tokens": ("int32", rejected),
        }
        scalars = {"num_padding_slots_per_request": layout.num_padding_slots_per_request,
                   "parallel_drafting_token_id": 7, "shift_input_ids": layout.shift_input_ids,
                   "max_query_len": layout.max_query_len}  # fmt: skip
        return OpCase(op, tensors, scalars, rule, argument)
    if op == "extend_queries_by_n":
        seq_lens = list(layout.seq_lens)
        if rule.startswith("seq_lens"):
            seq_lens[b] = lens[b] - _int(draw, 1, FAR)
        tensors = {"query_start_loc": ("int32", qsl), "seq_lens": ("int32", seq_lens)}
        return OpCase(op, tensors, {"n": layout.num_padding_slots_per_request}, rule, argument)
    table = [list(row) for row in layout.block_table]
    t = layout.query_start_loc[b] + draw(st.integers(0, lens[b] - 1))
    if rule.startswith("positions"):
        positions[t] = -_int(draw, 1, FAR)
    elif rule.startswith("block_table"):
        column = min(min(positions[t], layout.max_model_len - 1) // layout.block_size, len(table[b]) - 1)
        table[b][column] = -_int(draw, 1, FAR)
    tensors = {"positions": ("int64", positions), "is_rejected_token_mask": ("bool", [False] * num_tokens),
               "query_start_loc": ("int32", qsl), "block_table": ("int32", table)}  # fmt: skip
    scalars = {"block_size": layout.block_size, "max_model_len": layout.max_model_len,
               "max_query_len": layout.max_query_len}  # fmt: skip
    return OpCase(op, tensors, scalars, rule, argument)


# ----------------------------------------------------------------------- sampling

SAMPLING_RULES = {
    "draft_sample": [*TEMPERATURE_RULES, "step: outside [0, K)"],
    "rejection_sample": [*TEMPERATURE_RULES, "num_draft_tokens: past K", "draft_tokens: outside the vocabulary",
                         "draft_tokens: not -1 past the drafts"],
}  # fmt: skip


@st.composite
def invalid_sampling_cases(draw, op: str | None = None, rule: str | None = None) -> OpCase:
    """draft_sample (with a probs buffer) / rejection_sample (one-hot drafts)."""
    op = op or draw(st.sampled_from(sorted(SAMPLING_RULES)))
    rule = rule or draw(st.sampled_from(SAMPLING_RULES[op]))
    batch = draw(sampling_batches(max_requests=4, max_vocab=64, min_requests=1))
    t = batch.tensors()
    b = draw(st.integers(0, batch.num_reqs - 1))
    temperature, drafts, counts = list(batch.temperature), t["draft_tokens"].tolist(), list(batch.num_draft)
    step = draw(st.integers(0, batch.num_spec - 1))
    k, vocab = batch.num_spec, batch.vocab
    if rule in TEMPERATURE_RULES:
        what = rule.split(": ")[1]
        temperature[b] = {"negative": -draw(st.floats(1e-3, 1e30)), "NaN": float("nan"), "inf": float("inf")}[what]
    elif rule.startswith("step"):
        step = draw(st.sampled_from([-_int(draw, 1, FAR), k + _int(draw, 0, FAR)]))
    elif rule == "num_draft_tokens: past K":
        counts[b] = k + _int(draw, 1, FAR)
    elif rule == "draft_tokens: outside the vocabulary":
        counts[b] = max(counts[b], 1)
        drafts[b] = [draw(st.integers(0, vocab - 1)) if j < counts[b] else -1 for j in range(k)]
        drafts[b][0] = draw(st.sampled_from([vocab + _int(draw, 0, FAR), -_int(draw, 2, FAR)]))
    else:
        counts[b] = min(counts[b], k - 1)
        drafts[b][counts[b]] = draw(st.integers(0, vocab - 1))
    common = {"temperature": ("float32", temperature), "seeds": ("int64", list(batch.seeds)),
              "positions": ("int64", list(batch.positions))}  # fmt: skip
    argument = rule.split(":")[0]
    if op == "draft_sample":
        tensors = {"logits": ("float32", t["logits"].tolist()), **common,
                   "probs_out": ("float32", [[[0.0] * vocab] * k] * batch.num_reqs), "step": ("int64", step)}  # fmt: skip
        write = draw(st.sampled_from(["probs", "logits"]))
        return OpCase(op, tensors, {"write": write}, rule, argument, ("probs_out",))
    tensors = {"draft_tokens": ("int64", drafts), "num_draft_tokens": ("int64", counts),
               "target_logits": ("float32", t["target_logits"].tolist()), **common}  # fmt: skip
    return OpCase(op, tensors, {"draft_probs": None}, rule, argument)


# --------------------------------------------------------------------- every op

FAMILIES = (
    (SHIFT_RULES, invalid_shift_cases),
    (STEP_RULES, invalid_step_cases),
    (PREPARE_RULES, invalid_prepare_cases),
    (EXPAND_RULES, invalid_expand_cases),
    (SAMPLING_RULES, invalid_sampling_cases),
    (TREE_RULES, invalid_tree_cases),
    (MARKOV_RULES, invalid_markov_cases),
    (BUDGET_RULES, invalid_budget_cases),
    (TRUNCATION_RULES, invalid_truncation_cases),
    (ATTENTION_RULES, invalid_attention_cases),
)
OP_RULES = {op: rules for table, _ in FAMILIES for op, rules in table.items()}


def invalid_op_cases(op: str | None = None, rule: str | None = None) -> st.SearchStrategy[OpCase]:
    """One op call with one rule broken: `op` and `rule` fixed, or drawn (OP_RULES lists
    every op's rules)."""
    if op is None:
        return st.one_of(*(strategy() for _, strategy in FAMILIES))
    for table, strategy in FAMILIES:
        if op in table:
            if rule is not None and rule not in table[op]:
                raise ValueError(f"rule: {rule!r} is not one of {op}'s: {table[op]}")
            return strategy(op, rule)
    raise ValueError(f"op: no invalid cases for {op!r}; ops with them: {sorted(OP_RULES)}")
