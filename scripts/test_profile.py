"""Sum up a test-suite profile written under SPECDRAFT_TEST_PROFILE=DIR
(tests/fixtures/compile_profile.py): totals, the files and the tests that take the
most time, and how much of it torch.compile took.

    SPECDRAFT_TEST_PROFILE=/tmp/prof python -m pytest -n 2 -m "not interpreter" tests
    python scripts/test_profile.py /tmp/prof --top 50 > profile.md
"""

import argparse
import glob
import json
import os
from collections import defaultdict

COLUMNS = [
    "wall_s",
    "compile_s",
    "inductor_s",
    "build_s",
    "graphs",
    "recompiles",
    "restarts",
    "fx_cache_miss",
    "fx_cache_hit",
]


def load(directory: str, lane: str = "") -> list[dict]:
    rows = []
    for path in sorted(glob.glob(os.path.join(directory, f"{lane}*.jsonl"))):
        with open(path) as lines:
            rows.extend(json.loads(line) for line in lines if line.strip())
    return rows


def table(title: str, rows: list[dict], key: str) -> str:
    head = f"| {key} | " + " | ".join(COLUMNS) + " |"
    rule = "|---" * (len(COLUMNS) + 1) + "|"
    body = [f"| {row[key]} | " + " | ".join(_fmt(row.get(c, 0)) for c in COLUMNS) + " |" for row in rows]
    return "\n".join([f"### {title}", "", head, rule, *body, ""])


def _fmt(value) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def by_file(rows: list[dict]) -> list[dict]:
    files = defaultdict(lambda: defaultdict(float))
    for row in rows:
        name = row["test"].split("::")[0]
        for column in COLUMNS:
            files[name][column] += row.get(column, 0)
    out = []
    for name, sums in files.items():
        row = {"file": name, **{c: (int(v) if c not in ("wall_s", "compile_s", "inductor_s", "build_s") else v)
                                for c, v in sums.items()}}  # fmt: skip
        out.append(row)
    return sorted(out, key=lambda r: -r["wall_s"])


def write_durations(directory: str, path: str) -> None:
    """{lane: {test file: seconds}}, what tests/conftest.py orders the files by."""
    durations = {}
    for lane in ("cpu", "interpreter"):
        files = by_file(load(directory, lane))  # heaviest first
        if files:
            durations[lane] = {row["file"]: round(row["wall_s"], 1) for row in files}
    with open(path, "w") as out:
        json.dump(durations, out, indent=1)
        out.write("\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", help="the SPECDRAFT_TEST_PROFILE directory")
    parser.add_argument("--top", type=int, default=50, help="how many tests and files to list (default 50)")
    parser.add_argument("--lane", default="", help="cpu or interpreter: that lane's tests only (default both)")
    parser.add_argument("--write-durations", metavar="JSON",
                        help="also write each lane's seconds per test file there (tests/file_durations.json)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.write_durations:
        write_durations(args.directory, args.write_durations)
    rows = load(args.directory, args.lane)
    if not rows:
        raise SystemExit(f"no profile lines under {args.directory}")
    totals = {c: sum(row.get(c, 0) for row in rows) for c in COLUMNS}
    compiling = sum(1 for row in rows if row.get("graphs", 0) > 0)
    print(f"{len(rows)} tests; {compiling} of them compiled at least one graph.\n")
    print("Summed over the workers (worker-seconds, not wall time):\n")
    print(table("Totals", [{"what": "all tests", **totals}], "what"))
    print(table(f"The {args.top} slowest tests", sorted(rows, key=lambda r: -r["wall_s"])[: args.top], "test"))
    print(table(f"The {min(args.top, 25)} slowest files", by_file(rows)[: min(args.top, 25)], "file"))


if __name__ == "__main__":
    main()
