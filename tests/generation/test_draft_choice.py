"""Drafts by batch size (generation.draft_choice): the fastest lossless configuration
per measured batch size when it beats plain decoding by the margin, else plain
decoding; a batch size between rows takes the next larger row's choice."""

import json
import pathlib

import pytest

from specdraft.generation.draft_choice import DEMO_PAIR_DRAFTS, choose_by_batch, default_drafts, load_rows
from specdraft.proposers import TreeShape


def row(batch, depth, topk, n, rate, plain, lossless=True):
    return {"B": batch, "depth": depth, "topk": topk, "N": n, "decode_tokens_per_s": rate,
            "plain_tokens_per_s": plain, "lossless": lossless}  # fmt: skip


ROWS = [
    row(1, 5, 1, 6, 200.0, 100.0),
    row(1, 5, 4, 16, 250.0, 100.0),
    row(1, 7, 4, 32, 400.0, 100.0, lossless=False),  # fastest, but its output differed: never chosen
    row(8, 5, 1, 6, 900.0, 800.0),
    row(8, 3, 1, 4, 1000.0, 800.0),
    row(64, 5, 1, 6, 5100.0, 5000.0),  # 1.02x: inside the margin, so plain decoding
    row(64, 3, 4, 8, 4000.0, 5000.0),
]


def test_the_fastest_lossless_configuration_per_batch_size():
    assert choose_by_batch(ROWS) == ((1, TreeShape(5, 4, 16)), (8, TreeShape(3, 1, 4)), (64, None))
    assert choose_by_batch(ROWS, margin=1.01)[-1] == (64, TreeShape(5, 1, 6))


@pytest.mark.parametrize(("num_requests", "want"), [(1, TreeShape(5, 4, 16)), (2, TreeShape(3, 1, 4)),
                                                    (8, TreeShape(3, 1, 4)), (9, None), (64, None), (500, None)])  # fmt: skip
def test_a_batch_takes_the_next_measured_batch_sizes_choice(num_requests, want):
    assert default_drafts(num_requests, choose_by_batch(ROWS)) == want


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="^num_requests"):
        default_drafts(0, choose_by_batch(ROWS))
    with pytest.raises(ValueError, match="^table"):
        default_drafts(1, ())


def committed_rows() -> list[dict]:
    """The committed sweep's rows (benchmarks/results/tree_batch.jsonl, each row its
    config and metrics merged), profiled runs left out; at a batch size measured both
    ways, the medians of repeated calls replace the single-call rows."""
    table = pathlib.Path(__file__).parents[2] / "benchmarks" / "results" / "tree_batch.jsonl"
    rows = [json.loads(line) for line in table.read_text().splitlines()]
    rows = [{**r["config"], **r["metrics"]} for r in rows if not r["config"]["profile"]]
    medians = {r["B"] for r in rows if r["repeats"] > 1}
    return [r for r in rows if r["repeats"] > 1 or r["B"] not in medians]


def test_the_demo_pairs_table_is_the_committed_measurements_choice():
    rows = committed_rows()
    assert sorted({r["B"] for r in rows}) == [1, 2, 4, 8, 16, 32, 64]
    assert DEMO_PAIR_DRAFTS == choose_by_batch(rows)
    # The choice the sweep made (benchmarks/README.md, "Draft trees by batch size").
    assert DEMO_PAIR_DRAFTS == ((1, TreeShape(3, 1, 4)), (2, None), (4, TreeShape(5, 1, 6)), (8, TreeShape(3, 4, 8)),
                                (16, TreeShape(3, 4, 8)), (32, TreeShape(5, 4, 16)), (64, TreeShape(3, 1, 4)))  # fmt: skip


def test_the_shipped_rows_are_the_committed_measurements():
    """The package's rows (what DEMO_PAIR_DRAFTS is chosen from at run time) are the
    table's, as `python benchmarks/bench_tree_batch.py --write-drafts` writes them."""
    key = lambda r: (r["B"], r["depth"], r["topk"], r["N"])  # noqa: E731
    fields = ("decode_tokens_per_s", "plain_tokens_per_s", "lossless")
    want = sorted(({"key": key(r), **{f: r[f] for f in fields}} for r in committed_rows()), key=lambda r: r["key"])
    got = sorted(({"key": key(r), **{f: r[f] for f in fields}} for r in load_rows()), key=lambda r: r["key"])
    assert got == want
