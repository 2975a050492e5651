"""Which drafts to run at a batch size: a tree, a chain, or none, from a measured
table (never a silent slowdown).

A tree's extra draft work and verify tokens buy more accepted tokens per pass, which
pays where the target's pass dominates and stops paying as the batch grows (the
verify pass turns compute-bound, the draft's batch B * topk grows). So the choice
is made per batch size from measurements of the pair being served:
`benchmarks/bench_tree_batch.py` writes decode tokens/s of plain decoding, chains
and trees at each B, and `choose_by_batch` keeps, at each measured B, the fastest
lossless configuration if it beats plain decoding by `margin`, else none.
`default_drafts(num_requests, table)` then reads the table at the smallest measured
B that is at least num_requests (the largest beyond it).

DEMO_PAIR_DRAFTS is that table for the shipped demo pair: choose_by_batch of the
measured rows in demo_pair_drafts.json beside this module (H200, torch 2.11, 96 greedy
tokens per request; at B = 1, 8, 32 and 64 the medians of three timed calls, at B = 2,
4 and 16 single calls; at B = 2 nothing beat plain decoding). Those rows are the
demo pair's rows of benchmarks/results/tree_batch.jsonl, written by

    python benchmarks/bench_tree_batch.py --write-drafts

after a sweep (`python3 benchmarks/bench_tree_batch.py` on the GPU appends to the
table); a test keeps the two equal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from importlib import resources

from specdraft.checks import check_int_range
from specdraft.proposers.tree_build import TreeShape

from .step_costs import measured_batch_for

DraftsTable = tuple[tuple[int, TreeShape | None], ...]  # (batch size, drafts), batch sizes ascending


def shape_of(row: Mapping) -> TreeShape:
    """The TreeShape of a bench_tree_batch row (a chain of depth D: topk 1, N = D + 1)."""
    return TreeShape(int(row["depth"]), int(row["topk"]), int(row["N"]))


def choose_by_batch(rows: Iterable[Mapping], margin: float = 1.05) -> DraftsTable:
    """At each batch size B of bench_tree_batch rows (keys B, depth, topk, N,
    decode_tokens_per_s, plain_tokens_per_s, lossless): the fastest lossless
    configuration, or None (plain decoding) where none is `margin` times faster
    than plain decoding."""
    best: dict[int, tuple[float, TreeShape | None]] = {}
    for row in rows:
        if not row["lossless"]:
            continue
        batch, speedup = int(row["B"]), row["decode_tokens_per_s"] / row["plain_tokens_per_s"]
        if speedup >= margin and speedup > best.get(batch, (0.0, None))[0]:
            best[batch] = (speedup, shape_of(row))
        best.setdefault(batch, (0.0, None))
    return tuple((batch, best[batch][1]) for batch in sorted(best))


def default_drafts(num_requests: int, table: DraftsTable) -> TreeShape | None:
    """The drafts `table` chose at the smallest batch size >= num_requests (the
    largest row beyond the table): a TreeShape (topk 1 and N = depth + 1: the
    chain), or None for plain decoding."""
    check_int_range("num_requests", num_requests, 1, 2**31 - 1)
    if not table:
        raise ValueError("table: no measured batch sizes")
    rows = dict(table)
    return rows[measured_batch_for(rows, num_requests)]


def load_rows(name: str = "demo_pair_drafts.json") -> list[dict]:
    """The measured rows shipped beside this module (see the module docstring)."""
    return json.loads(resources.files(__package__).joinpath(name).read_text())["rows"]


DEMO_PAIR_DRAFTS: DraftsTable = choose_by_batch(load_rows())
