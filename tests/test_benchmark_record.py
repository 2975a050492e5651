"""The benchmark record (benchmarks/record.py, benchmarks/README.md): benchmarks/results
holds data tables and their plots only, every committed row has the fixed keys, and a
bench's rows go through record.append_rows with them."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
KEYS = ["bench", "config", "metrics", "device", "torch", "triton", "commit", "date", "command"]
TABLES = sorted(RESULTS.glob("*.jsonl"))


def load_record():
    spec = importlib.util.spec_from_file_location("bench_record", ROOT / "benchmarks" / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_hold_tables_and_plots_only():
    assert TABLES, "no tables under benchmarks/results"
    # Files, not folders: git keeps no empty folder, and a copy laid over an older tree
    # (the GPU machine's) may leave the old ones empty.
    others = [p.relative_to(ROOT) for p in RESULTS.rglob("*") if p.is_file() and p.suffix not in (".jsonl", ".png")]
    assert others == []
    assert [p.relative_to(ROOT) for p in RESULTS.iterdir() if p.is_dir() and any(p.iterdir())] == []
    assert [p.relative_to(ROOT) for p in (ROOT / "benchmarks").rglob("*.log")] == []


@pytest.mark.parametrize("table", TABLES, ids=lambda p: p.stem)
def test_every_row_has_the_fixed_keys(table):
    lines = table.read_text().splitlines()
    assert lines
    for number, line in enumerate(lines, 1):
        row = json.loads(line)
        where = f"{table.name}:{number}"
        assert list(row) == KEYS, where
        assert row["bench"] == table.stem, where
        assert isinstance(row["config"], dict) and row["config"], where
        assert isinstance(row["metrics"], dict) and row["metrics"], where
        for key in KEYS[3:]:
            assert isinstance(row[key], str) and row[key], f"{where}: {key}"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), where


def without_inductor_settings(monkeypatch):
    import os

    for name in os.environ:
        if name.startswith("TORCHINDUCTOR_"):
            monkeypatch.delenv(name)


def test_a_bench_appends_rows_with_the_fixed_keys(tmp_path, monkeypatch):
    record = load_record()
    monkeypatch.setenv("BENCH_RESULTS", str(tmp_path))
    without_inductor_settings(monkeypatch)
    headers = ["B", "triton op µs", "% of copy"]
    record.append_table("demo_table", headers, [[1, 2.5, "3,004"], [8, 1.25, "-"]], config_columns=1,
                        config={"op": "x"}, device="CPU")  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "demo_table.jsonl").read_text().splitlines()]
    assert [list(r) for r in rows] == [KEYS, KEYS]
    assert [r["config"] for r in rows] == [{"op": "x", "B": 1}, {"op": "x", "B": 8}]
    assert [r["metrics"] for r in rows] == [{"triton_op_us": 2.5, "pct_of_copy": 3004},
                                            {"triton_op_us": 1.25, "pct_of_copy": None}]  # fmt: skip
    assert rows[0]["device"] == "CPU" and rows[0]["bench"] == "demo_table"


def test_a_row_names_the_inductor_settings_it_ran_under(tmp_path, monkeypatch):
    """A run with an Inductor setting from the environment is another configuration
    (its own row in `latest`); where caches live is not a setting."""
    record = load_record()
    monkeypatch.setenv("BENCH_RESULTS", str(tmp_path))
    without_inductor_settings(monkeypatch)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    record.append_rows("t", [({"B": 1}, {"us": 1.0})], device="CPU")
    monkeypatch.setenv("TORCHINDUCTOR_LOOP_ORDERING_AFTER_FUSION", "0")
    monkeypatch.setenv("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", "1")
    record.append_rows("t", [({"B": 1}, {"us": 2.0})], device="CPU")
    rows = record.read_rows("t", tmp_path)
    assert [r["config"] for r in rows] == [
        {"B": 1},
        {"B": 1, "inductor_env": "COORDINATE_DESCENT_TUNING=1 LOOP_ORDERING_AFTER_FUSION=0"},
    ]
    assert [r["metrics"]["us"] for r in record.latest(rows)] == [1.0, 2.0]


def test_no_section_is_titled_by_its_day_and_no_script_by_an_issue():
    for doc in [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "docs" / "development.md"]:
        titles = [line for line in doc.read_text().splitlines() if line.startswith("#")]
        assert [t for t in titles if re.search(r"\d{4}-\d{2}-\d{2}", t)] == [], doc.name
    assert [p.name for p in (ROOT / "scripts").iterdir() if re.search(r"issue\d*", p.name)] == []
