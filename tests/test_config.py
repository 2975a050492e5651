"""SpeculativeConfig validation: every field's bad values raise a ValueError that
names the field; good values are accepted and kept as given.

Type and sign checks of the flags and the salt are at the bottom (bools are ints in
Python, so they need their own cases)."""

import dataclasses
import re

import pytest

from specdraft.config import SpeculativeConfig

GOOD = [
    {},
    {"method": "eagle"},
    {"method": "eagle3"},
    {"method": "mtp"},
    {"num_speculative_tokens": 1},
    {"num_speculative_tokens": 16},
    {"max_model_len": 1},
    {"max_model_len": 131072},
    {"block_size": 1},
    {"block_size": 256},
    {"draft_sampling": "greedy"},
    {"draft_sampling": "probabilistic"},
    {"draft_sampling": "probabilistic", "return_probs": "probs"},
    {"draft_sampling": "probabilistic", "return_probs": "logits"},
    {"draft_sampling": "greedy", "return_probs": "probs"},
    {"return_probs": None},
    {"parallel_drafting": True, "parallel_drafting_token_id": 0},
    {"parallel_drafting": True, "parallel_drafting_token_id": 128_000},
    # The mask token may be set ahead of switching parallel drafting on.
    {"parallel_drafting": False, "parallel_drafting_token_id": 7},
    {"salt": 0},
    {"salt": 12345},
    {"salt": 2**31 - 1},
    {"draft_truncation": False},
]

# (field the error must name, the bad fields)
BAD = [
    ("method", {"method": "medusa"}),
    ("method", {"method": "EAGLE"}),
    ("method", {"method": None}),
    ("method", {"method": ""}),
    *[
        (name, {name: value})
        for name in ("num_speculative_tokens", "max_model_len", "block_size")
        for value in (0, -1, 2.0, "3", None, True, False)
    ],
    ("draft_sampling", {"draft_sampling": "random"}),
    ("draft_sampling", {"draft_sampling": None}),
    ("draft_sampling", {"draft_sampling": "Greedy"}),
    ("return_probs", {"return_probs": "log_probs"}),
    ("return_probs", {"return_probs": ""}),
    ("return_probs", {"return_probs": True}),
    # parallel drafting needs the token id its K - 1 mask slots carry
    ("parallel_drafting_token_id", {"parallel_drafting": True}),
    ("parallel_drafting_token_id", {"parallel_drafting": True, "parallel_drafting_token_id": None}),
    # salt in [0, 2**31)
    ("salt", {"salt": -1}),
    ("salt", {"salt": 2**31}),
    ("salt", {"salt": 2**40}),
    ("salt", {"salt": 1.0}),
    ("salt", {"salt": "0"}),
    ("salt", {"salt": None}),
]


def names(field: str) -> str:
    # The field as a word: "parallel_drafting" must not match inside "parallel_drafting_token_id".
    return rf"(?<![\w]){re.escape(field)}(?![\w])"


@pytest.mark.parametrize("fields", GOOD, ids=lambda f: ",".join(f"{k}={v!r}" for k, v in f.items()) or "defaults")
def test_good_values_are_accepted(fields):
    config = SpeculativeConfig(**fields)
    for name, value in fields.items():
        assert getattr(config, name) == value


@pytest.mark.parametrize(("field", "fields"), BAD, ids=lambda x: x if isinstance(x, str) else repr(x))
def test_bad_value_raises_naming_the_field(field, fields):
    with pytest.raises(ValueError, match=names(field)):
        SpeculativeConfig(**fields)


@pytest.mark.parametrize(("field", "fields"), BAD[:4] + BAD[-6:], ids=lambda x: x if isinstance(x, str) else repr(x))
def test_replace_validates_again(field, fields):
    # dataclasses.replace builds a new instance, so a derived config is checked too.
    with pytest.raises(ValueError, match=names(field)):
        dataclasses.replace(SpeculativeConfig(), **fields)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SpeculativeConfig().num_speculative_tokens = 0  # would bypass validation


def test_defaults():
    config = SpeculativeConfig()
    assert (config.method, config.num_speculative_tokens, config.draft_sampling, config.return_probs) == (
        "eagle",
        3,
        "greedy",
        None,
    )
    assert (config.parallel_drafting, config.parallel_drafting_token_id, config.salt) == (False, None, 0)
    assert config.draft_truncation is True  # drafts sampled inside a request's top-k / top-p / min-p


# ------------------------------------------------------ types and signs

TYPE_CASES = [
    pytest.param("salt", {"salt": True}, id="salt=True (a bool is an int)"),
    pytest.param("parallel_drafting", {"parallel_drafting": "yes", "parallel_drafting_token_id": 0}, id="flag=str"),
    pytest.param("parallel_drafting", {"parallel_drafting": 1, "parallel_drafting_token_id": 0}, id="flag=1"),
    pytest.param("draft_truncation", {"draft_truncation": 0}, id="draft_truncation=0"),
    pytest.param("draft_truncation", {"draft_truncation": "yes"}, id="draft_truncation=str"),
    pytest.param(
        "parallel_drafting_token_id", {"parallel_drafting": True, "parallel_drafting_token_id": -1}, id="token=-1"
    ),
    pytest.param(
        "parallel_drafting_token_id", {"parallel_drafting": True, "parallel_drafting_token_id": 1.5}, id="token=1.5"
    ),
    pytest.param(
        "parallel_drafting_token_id", {"parallel_drafting": True, "parallel_drafting_token_id": "7"}, id="token=str"
    ),
]


@pytest.mark.parametrize(("field", "fields"), TYPE_CASES)
def test_types_and_signs_name_the_field(field, fields):
    with pytest.raises(ValueError, match=names(field)):
        SpeculativeConfig(**fields)
