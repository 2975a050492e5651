"""`python -m specdraft.eval`: on shards the shipped target wrote, the numbers it
reports are a plain loop's over the head's drafts (greedy drafts from the eager
unroll, whose equality with propose is tests/training/test_unroll_propose.py) and
the target's argmax, and at a temperature with --top-k / --top-p / --min-p the
plain loop's Σ min(p~, q~) over truncated rows; --plot writes a PNG, --json the
metrics; bad input exits 2 with one line naming what is wrong (the option, or the
file), checked before the evaluation; a compiled step announces its one-time
compile on stderr."""

import importlib
import json
import shutil
import sys

import pytest
import torch

from specdraft.assets import DEMO_PAIR, load_demo_pair
from specdraft.demo import PROMPTS
from specdraft.eval import main
from specdraft.models import default_aux_layers
from specdraft.training import capture_target_outputs, save_batch, unroll_for_eval

import specs.vocab_metrics as spec

K = 3
LENGTHS = ((40, 9), (23, 31, 4))  # two shards; a 4-byte sequence has no full start


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    target, head = load_demo_pair()
    gen = torch.Generator().manual_seed(11)
    # The demo's prompts, not this file's text: editing a test must not move the data.
    text = "\n".join(PROMPTS).encode()
    batches = []
    for i, lengths in enumerate(LENGTHS):
        seqs = []
        for n in lengths:
            start = int(torch.randint(0, len(text) - n, (1,), generator=gen))
            seqs.append(torch.tensor(list(text[start : start + n])))
        batch = capture_target_outputs(target, seqs, aux_layers=default_aux_layers(4))
        save_batch(folder / f"shard-{i}.safetensors", batch, aux_layers=default_aux_layers(4))
        batches.append((batch, lengths))
    return folder, head, batches


def plain_loop(head, batches):
    """Per step k: scored rows, greedy matches, and starts whose drafts 1..k all
    match (full starts only: all K target rows inside the sequence)."""
    count, matches, prefix, starts = [0] * K, [0] * K, [0] * K, 0
    for batch, lengths in batches:
        drafts = unroll_for_eval(head, *batch.unroll_args(), num_steps=K).draft_tokens
        argmax = batch.target_logits.argmax(-1)
        begin = 0
        for n in lengths:
            for t in range(begin, begin + n):
                ok = []
                for k in range(K):
                    row = t + k + 1
                    if row < begin + n:
                        count[k] += 1
                        ok.append(int(drafts[k, t]) == int(argmax[row]))
                        matches[k] += ok[-1]
                if len(ok) == K:
                    starts += 1
                    for k in range(K):
                        prefix[k] += all(ok[: k + 1])
            begin += n
    return count, matches, prefix, starts


def test_reports_the_plain_loops_numbers(data, tmp_path, capsys):
    folder, head, batches = data
    png, record = tmp_path / "acceptance.png", tmp_path / "metrics.json"
    argv = [
        "demo",
        str(folder),
        "--steps",
        str(K),
        "--eager",
        "--no-progress",
        "--plot",
        str(png),
        "--json",
        str(record),
    ]
    assert main(argv) == 0
    count, matches, prefix, starts = plain_loop(head, batches)
    got = json.loads(record.read_text())
    assert got["sums"]["count"] == count
    assert got["sums"]["matches"] == matches
    assert got["sums"]["accepted_prefix"] == prefix
    assert got["sums"]["starts"] == starts
    assert got["acceptance_length"] == pytest.approx(sum(prefix) / starts, rel=1e-12)
    assert got["timing"]["tokens"] == sum(sum(lengths) for lengths in LENGTHS)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert f"greedy acceptance length (exact, per start): {sum(prefix) / starts:.4f}" in out
    for k in range(K):
        assert f"{k + 1:>4}  {count[k]:>9}  {matches[k] / count[k]:>10.4f}" in out


def test_truncation_flags_give_the_plain_loops_acceptance(data, tmp_path, capsys):
    """--temperature 0.7 --top-k 20 --top-p 0.9: the per-step Σ min(p~, q~) is the plain
    loop's (specs.truncation's cut of each draft and target row, then Σ min) over the
    eager unroll's logits; the header and the expected line name the setting."""
    folder, head, batches = data
    record = tmp_path / "metrics.json"
    flags = ["--temperature", "0.7", "--top-k", "20", "--top-p", "0.9", "--json", str(record)]
    assert main(["demo", str(folder), "--steps", str(K), "--eager", "--no-progress", *flags]) == 0
    accept, margins = [0.0] * K, []
    for batch, lengths in batches:
        with torch.no_grad():
            logits = unroll_for_eval(head, *batch.unroll_args(), num_steps=K).logits
        n = batch.num_tokens
        sums = spec.draft_metric_sums([[row.tolist() for row in logits[k].double()] for k in range(K)],
                                      [row.tolist() for row in batch.target_logits.double()], [True] * n, [0.7] * n,
                                      list(lengths), None, False, [(20, 0.9, 0.0)] * n, margins)  # fmt: skip
        accept = [a + b for a, b in zip(accept, sums["accept"], strict=True)]
    assert min(margins) > 1e-4, min(margins)  # no top-p decision within float rounding of its boundary
    got = json.loads(record.read_text())
    assert got["sums"]["accept"] == pytest.approx(accept, rel=1e-5)
    assert got["sampling"] == {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.0}
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("tokens=draft, temperature 0.7, top-k 20, top-p 0.9")
    assert "expected at temperature 0.7, top-k 20, top-p 0.9 (Σ min(p,q))" in out


def test_budget_flag_reports_the_plain_loops_budget_sums(data, tmp_path, capsys):
    """--budget 1.5: the per-gain-bin sums are the plain loop's (each draft's gain the
    product of its largest probabilities so far, over the eager unroll's logits), the
    table's last row verifies all K drafts and accepts the exact acceptance length,
    and --budget's row is marked; the JSON holds the table."""
    folder, head, batches = data
    record = tmp_path / "metrics.json"
    flags = ["--eager", "--no-progress", "--budget", "1.5", "--json", str(record)]
    assert main(["demo", str(folder), "--steps", str(K), *flags]) == 0
    want = {name: [0.0] * spec.NUM_BINS for name in ("budget_drafts", "budget_accepted")}
    margins = []
    for batch, lengths in batches:
        with torch.no_grad():
            logits = unroll_for_eval(head, *batch.unroll_args(), num_steps=K).logits
        sums = spec.draft_metric_sums([[row.tolist() for row in logits[k].double()] for k in range(K)],
                                      [row.tolist() for row in batch.target_logits.double()],
                                      [True] * batch.num_tokens, [0.0] * batch.num_tokens, list(lengths),
                                      survival="draft", bin_margins=margins)  # fmt: skip
        for name, values in want.items():
            want[name] = [a + b for a, b in zip(values, sums[name], strict=True)]
    assert min(margins) > 1e-4, min(margins)
    got = json.loads(record.read_text())
    for name, values in want.items():
        assert got["sums"][name] == values, name
    budget = {point["verified"]: point for point in got["budget"]}
    assert sorted(budget) == [0.5, 1.0, 1.5, 2.0, 3.0]
    assert budget[3.0]["accepted"] == pytest.approx(got["acceptance_length"], rel=1e-12)
    assert budget[3.0]["fixed_accepted"] == pytest.approx(got["acceptance_length"], rel=1e-12)
    out = capsys.readouterr().out
    assert "budgeted verification (drafts ranked by the draft's confidence" in out
    row = budget[1.5]
    assert f"    1.50  {row['accepted']:>9.4f}  {row['fixed_accepted']:>9.4f}  <- --budget" in out


def test_a_budget_above_k_is_refused(data, capsys):
    folder, _, _ = data
    assert main(["demo", str(folder), "--steps", "2", "--budget", "2.5", "--eager", "--no-progress"]) == 2
    assert "--budget 2.5: at most K = 2 drafts per start can be verified" in error_line(capsys)


def test_a_head_folder_without_embedding_needs_the_target(data, tmp_path, capsys):
    folder, _, _ = data
    head_folder = str(DEMO_PAIR / "eagle3")
    assert main([head_folder, str(folder), "--eager", "--no-progress"]) == 2
    assert "pass --target TARGET_FOLDER" in capsys.readouterr().err
    argv = [head_folder, str(folder), "--eager", "--no-progress", "--target", str(DEMO_PAIR / "target")]
    assert main(argv + ["--json", str(tmp_path / "a.json")]) == 0
    assert main(["demo", str(folder), "--eager", "--no-progress", "--json", str(tmp_path / "b.json")]) == 0
    assert (
        json.loads((tmp_path / "a.json").read_text())["sums"] == json.loads((tmp_path / "b.json").read_text())["sums"]
    )


def test_bad_data_exits_2(data, tmp_path, capsys):
    folder, _, _ = data
    assert main(["demo", str(tmp_path / "nothing"), "--eager", "--no-progress"]) == 2
    assert "is neither a .safetensors file nor a folder" in capsys.readouterr().err
    batch, _ = data[2][0]
    save_batch(tmp_path / "other.safetensors", batch, aux_layers=(0, 1, 2))
    assert main(["demo", str(tmp_path / "other.safetensors"), "--eager", "--no-progress"]) == 2
    assert "holds the target's layers [0, 1, 2]; the head fuses [2, 2, 1]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", str(folder), "--steps", "0"])


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    "file_name, content, message",
    [
        ("model.safetensors", b"\x00" * 64, "model.safetensors is not a readable safetensors file"),
        ("config.json", b"[", "config.json is not valid JSON"),
    ],
    ids=["corrupt-weights", "malformed-config"],
)
def test_a_broken_head_folder_names_the_file(data, tmp_path, capsys, file_name, content, message):
    folder = tmp_path / "head"
    shutil.copytree(DEMO_PAIR / "eagle3", folder)
    (folder / file_name).write_bytes(content)
    argv = [str(folder), str(data[0]), "--eager", "--no-progress", "--target", "demo"]
    assert main(argv) == 2
    line = error_line(capsys)
    assert line.startswith("error: HEAD: ") and str(folder / file_name) in line and message in line


def test_data_that_is_not_safetensors_exits_2(tmp_path, capsys):
    for content in (b"", b"garbage, not a shard", b"\xff" * 100):
        path = tmp_path / "data.txt"
        path.write_bytes(content)
        assert main(["demo", str(path), "--eager", "--no-progress"]) == 2
        line = error_line(capsys)
        assert line.startswith(f"error: DATA: {path} is not a safetensors file")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--temperature", "-1"], "--temperature must be >= 0, got -1.0"),
        (["--temperature", "nan"], "--temperature must be >= 0"),
        (["--top-p", "0"], "--top-p must be in (0, 1] (1: off), got 0.0"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1] (1: off), got 1.5"),
        (["--top-p", "nan"], "--top-p must be in (0, 1]"),
        (["--min-p", "-0.1"], "--min-p must be in [0, 1] (0: off), got -0.1"),
        (["--min-p", "nan"], "--min-p must be in [0, 1]"),
        (["--top-k", "2.5"], "argument --top-k: invalid int value: '2.5'"),
        (["--method", "mtp"], '--method mtp: HEAD "demo" is the shipped EAGLE-3 head'),
        (["--method", "eagle"], '--method eagle: HEAD "demo"'),
        (["--budget", "0"], "--budget must be > 0 drafts verified per start, got 0.0"),
        (["--budget", "nan"], "--budget must be > 0"),
    ],
)
def test_refused_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "data", *argv])
    assert exit_info.value.code == 2
    assert message in error_line(capsys)


def test_plot_without_matplotlib_fails_before_evaluating(data, tmp_path, capsys, monkeypatch):
    evaluate_module = importlib.import_module("specdraft.training.evaluate")  # the package's `evaluate` is the function

    def never(*args, **kwargs):
        raise AssertionError("evaluated although --plot cannot be written")

    monkeypatch.setattr(evaluate_module, "evaluate", never)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    png = tmp_path / "a.png"
    assert main(["demo", str(data[0]), "--eager", "--no-progress", "--plot", str(png)]) == 2
    line = error_line(capsys)
    assert line.startswith("error: --plot: plotting needs matplotlib")
    assert not png.exists()


def test_target_demo_is_the_shipped_target(data, tmp_path):
    folder, _, _ = data
    head_folder = str(DEMO_PAIR / "eagle3")
    base = [str(folder), "--eager", "--no-progress"]
    assert main([head_folder, *base, "--target", "demo", "--json", str(tmp_path / "a.json")]) == 0
    assert main(["demo", *base, "--json", str(tmp_path / "b.json")]) == 0
    assert (
        json.loads((tmp_path / "a.json").read_text())["sums"] == json.loads((tmp_path / "b.json").read_text())["sums"]
    )


def test_the_compile_is_announced_on_stderr_unless_no_progress(data, capsys, monkeypatch):
    """torch.compile stubbed out (the step runs eagerly): what is checked is the
    status lines around the compiled step's first call."""
    monkeypatch.setattr(torch, "compile", lambda fn, **options: fn)
    folder, _, _ = data
    assert main(["demo", str(folder)]) == 0
    err = capsys.readouterr().err
    assert "compiling the evaluation step (one-time, ~20-60 s on CPU)..." in err
    assert err.count("compiling the evaluation step") == 1
    assert "compiled in " in err
    assert main(["demo", str(folder), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_unwritable_outputs_fail_before_evaluating(data, tmp_path, capsys):
    """--json / --plot under a path that is a file: exit 2, one line, nothing evaluated."""
    folder, _, _ = data
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for option in ("--json", "--plot"):
        assert main(["demo", str(folder), "--no-progress", option, str(blocker / "out")]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith(f"error: {option}") and "cannot be written" in captured.err


def test_steps_beyond_the_longest_sequence_are_refused_before_evaluating(data, tmp_path, capsys, monkeypatch):
    """The fixture's longest sequence holds 40 tokens: K = 39 is the most a start can
    draft inside it; K = 40 (or 100000) is refused in one line, in under a second,
    without evaluating."""
    import time

    evaluate_module = importlib.import_module("specdraft.training.evaluate")

    def never(*args, **kwargs):
        raise AssertionError("evaluated although --steps is out of bounds")

    monkeypatch.setattr(evaluate_module, "evaluate", never)
    longest = max(max(lengths) for lengths in LENGTHS)
    for steps in (longest, 100000):
        start = time.perf_counter()
        assert main(["demo", str(data[0]), "--eager", "--no-progress", "--steps", str(steps)]) == 2
        assert time.perf_counter() - start < 1
        line = error_line(capsys)
        assert line.startswith(f"error: --steps {steps}: must be <= {longest - 1}")
        assert f"the longest sequence in DATA holds {longest} tokens" in line


def test_plot_and_json_create_missing_folders(data, tmp_path):
    png, record = tmp_path / "new" / "plots" / "a.png", tmp_path / "other" / "m.json"
    argv = ["demo", str(data[0]), "--eager", "--no-progress", "--plot", str(png), "--json", str(record)]
    assert main(argv) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(record.read_text())["sums"]["starts"] > 0


def test_the_plot_hint_works_without_a_package_index_entry(data, tmp_path, capsys, monkeypatch):
    """No `specdraft[plot]` (specdraft is not on a package index): the extra's own
    requirement, or the clone's extra."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["demo", str(data[0]), "--eager", "--no-progress", "--plot", str(tmp_path / "a.png")]) == 2
    line = error_line(capsys)
    assert 'pip install "matplotlib>=3.7"' in line and 'pip install ".[plot]"' in line
    assert "specdraft[" not in line
