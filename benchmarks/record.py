"""The benchmark record: one JSON-lines table per bench, benchmarks/results/<table>.jsonl.

Every row has the same keys (ROW_KEYS):

    bench    the table's name (its file name: a bench script may write several tables)
    config   what ran: the row's parameters ({"B": 8, "V": 152064, "op": ...})
    metrics  what was measured: the bench's own figures, each name carrying its unit
             (medians of CUDA-graph replays in "..._us", "decode_tokens_per_s", ...)
    device   the GPU's name ("CPU" for CPU runs)
    torch, triton  their versions
    commit   the specdraft commit that ran (git describe; "unknown" where not recorded)
    date     the day it ran (YYYY-MM-DD)
    command  the command that ran it

Benches append rows with `append_rows` (or `append_table`, from a markdown table's
headers and rows); rows are never rewritten, so a table is the history of its
measurements and `latest` picks the newest row of each configuration. Where a row
goes: $BENCH_RESULTS if set (scripts/gpu_setup.sh sets $OUT/results on the device
machine; `append` then adds them to the committed tables), else benchmarks/results/.
$BENCH_COMMIT, if set, is recorded as the commit in place of the checkout's.

    python benchmarks/record.py show tree_batch      # the newest rows as a markdown table
    python benchmarks/record.py append FOLDER        # FOLDER/<table>.jsonl (a device run's) onto the tables
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
ROW_KEYS = ("bench", "config", "metrics", "device", "torch", "triton", "commit", "date", "command")
UNKNOWN = "unknown"


def results_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("BENCH_RESULTS", RESULTS))


def table_path(table: str, directory: pathlib.Path | None = None) -> pathlib.Path:
    return (directory or results_dir()) / f"{table}.jsonl"


def slug(header: str) -> str:
    """A column header as a key: "triton op µs" -> "triton_op_us", "% of copy" ->
    "pct_of_copy"; a symbol keeps its case ("B", "T_in")."""
    if re.fullmatch(r"[A-Z][a-z]?(_[a-z]+)?", header):
        return header
    text = header.lower().replace("µ", "u").replace("%", "pct").replace("+", " plus ").replace("/", " per ")
    return re.sub(r"[^a-z0-9]+", "_", text).strip("_")


def commit() -> str:
    """$BENCH_COMMIT if set, else the checkout's commit (short hash, "-dirty" with
    uncommitted changes), else "unknown". The variable comes first: a copy of a
    working tree (the GPU machine's) can carry git metadata older than its files."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
                             text=True, cwd=RESULTS.parent, timeout=10, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    return out.stdout.strip() or UNKNOWN


def environment(device: str | None = None) -> dict:
    """Where and what ran: device, torch and triton versions, commit, date, command,
    and the Inductor settings from the environment (inductor_overrides)."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = UNKNOWN
    if device is None:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    return {"device": device, "torch": torch.__version__, "triton": triton_version, "commit": commit(),
            "date": datetime.date.today().isoformat(), "command": " ".join(["python", *sys.argv]),
            "inductor": inductor_overrides()}  # fmt: skip


# TORCHINDUCTOR_* variables that only say where caches live or what to log: they do
# not change what is compiled, so a row does not carry them.
NOT_CODEGEN = ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE")


def inductor_overrides() -> str:
    """The TORCHINDUCTOR_* settings of this process's environment that change what
    Inductor generates ("LOOP_ORDERING_AFTER_FUSION=0"), space-separated and sorted;
    "" where none is set."""
    return " ".join(
        f"{name.removeprefix('TORCHINDUCTOR_')}={value}"
        for name, value in sorted(os.environ.items())
        if name.startswith("TORCHINDUCTOR_") and name not in NOT_CODEGEN
    )


def make_row(table: str, config: Mapping, metrics: Mapping, env: Mapping) -> dict:
    """A row; a run under Inductor settings from the environment (inductor_overrides)
    says so in its config, so that it is not the same configuration as a default run."""
    config = dict(config)
    if env.get("inductor"):
        config["inductor_env"] = env["inductor"]
    row = {"bench": table, "config": config, "metrics": dict(metrics)}
    row.update({key: env[key] for key in ROW_KEYS[3:]})
    return row


def append_rows(table: str, rows: Iterable[tuple[Mapping, Mapping]], device: str | None = None) -> pathlib.Path:
    """Append (config, metrics) pairs to `table`, each with this run's environment."""
    env = environment(device)
    path = table_path(table)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for config, metrics in rows:
            f.write(json.dumps(make_row(table, config, metrics, env), ensure_ascii=False) + "\n")
    return path


def cell_value(value):
    """A markdown cell as data: "3,115" -> 3115, "2.25x" -> 2.25, "**1.53x**" -> 1.53,
    "10.8 / 11.0" -> [10.8, 11.0], "" / "-" -> None; other text stays text."""
    if not isinstance(value, str):
        return value
    text = value.strip().strip("*").strip()
    if text in ("", "-"):
        return None
    parts = [p.strip().strip("*").removesuffix("x").removesuffix("×").replace(",", "") for p in text.split(" / ")]
    try:
        numbers = [int(p) if re.fullmatch(r"-?\d+", p) else float(p) for p in parts]
    except ValueError:
        return text
    return numbers[0] if len(numbers) == 1 else numbers


def table_pairs(headers: Sequence[str], rows: Iterable[Sequence], config_columns: int,
                config: Mapping | None = None) -> list[tuple[dict, dict]]:  # fmt: skip
    """(config, metrics) pairs of a markdown table: its first `config_columns` columns
    are the configuration (after `config`), the rest the measurements."""
    keys = [slug(h) for h in headers]
    pairs = []
    for row in rows:
        cells = list(zip(keys, (cell_value(v) for v in row), strict=True))
        pairs.append(({**(config or {}), **dict(cells[:config_columns])}, dict(cells[config_columns:])))
    return pairs


def append_table(table: str, headers: Sequence[str], rows: Iterable[Sequence], config_columns: int,
                 config: Mapping | None = None, device: str | None = None) -> pathlib.Path:  # fmt: skip
    """append_rows of a markdown table's rows (see table_pairs)."""
    return append_rows(table, table_pairs(headers, rows, config_columns, config), device)


def read_rows(table: str, directory: pathlib.Path | None = None) -> list[dict]:
    path = table_path(table, directory)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tables(directory: pathlib.Path | None = None) -> list[str]:
    return sorted(p.stem for p in (directory or results_dir()).glob("*.jsonl"))


def latest(rows: Iterable[Mapping]) -> list[Mapping]:
    """The newest row of each configuration (rows are appended in time order), in the
    order the configurations first appear."""
    newest: dict[str, Mapping] = {}
    for row in rows:
        key = json.dumps(row["config"], sort_keys=True)
        newest.pop(key, None)
        newest[key] = row
    first_seen = {json.dumps(r["config"], sort_keys=True): i for i, r in reversed(list(enumerate(rows)))}
    return sorted(newest.values(), key=lambda r: first_seen[json.dumps(r["config"], sort_keys=True)])


def markdown(rows: Sequence[Mapping], columns: Sequence[str] | None = None) -> str:
    """Rows as a markdown table: config columns, then metrics, then device and commit;
    or just `columns` (config or metrics keys)."""

    def cell(v):
        if isinstance(v, float):
            return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3f}".rstrip("0").removesuffix(".") + (".0" * v.is_integer())
        if isinstance(v, list):
            return " / ".join(cell(x) for x in v)
        return "" if v is None else str(v)

    if columns is None:
        columns = [*dict.fromkeys(k for r in rows for k in r["config"]),
                   *dict.fromkeys(k for r in rows for k in r["metrics"]), "device", "commit"]  # fmt: skip
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        values = [r["config"].get(k, r["metrics"].get(k, r.get(k))) for k in columns]
        lines.append("| " + " | ".join(cell(v) for v in values) + " |")
    return "\n".join(lines)


def check_row(row: Mapping) -> None:
    """Raise ValueError unless `row` has exactly ROW_KEYS, config and metrics as mappings."""
    if tuple(row) != ROW_KEYS:
        raise ValueError(f"row keys {tuple(row)}, want {ROW_KEYS}")
    if not isinstance(row["config"], Mapping) or not isinstance(row["metrics"], Mapping):
        raise ValueError("config and metrics must be mappings")


def append_folder(folder: pathlib.Path) -> None:
    """Append every FOLDER/<table>.jsonl to benchmarks/results/<table>.jsonl, each row checked first."""
    for path in sorted(folder.glob("*.jsonl")):
        rows = read_rows(path.stem, folder)
        for row in rows:
            check_row(row)
        with table_path(path.stem, RESULTS).open("a") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        print(f"{path.stem}: {len(rows)} rows")


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Show a benchmark table's newest rows; append a run's rows.")
    parser.add_argument("command", choices=["show", "list", "append"])
    parser.add_argument("table", nargs="?", help="show: the table's name; append: the folder of a run's tables")
    parser.add_argument("--where", nargs="*", default=[], metavar="KEY=VALUE", help="only rows whose config matches")
    parser.add_argument("--all", action="store_true", help="every row, not just each configuration's newest")
    parser.add_argument("--columns", nargs="+", help="just these config / metrics keys")
    args = parser.parse_args(argv)
    if args.command == "append":
        append_folder(pathlib.Path(args.table))
        return 0
    if args.command == "list" or not args.table:
        print("\n".join(tables()))
        return 0
    rows = read_rows(args.table)
    for clause in args.where:
        key, _, value = clause.partition("=")
        rows = [r for r in rows if str(r["config"].get(key)) == value]
    print(markdown(rows if args.all else latest(rows), args.columns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
