"""The command line as a whole: `specdraft demo|capture|eval` (python -m specdraft and
the console script), --help without the models' code, help text on every option,
and bad input (a device this machine lacks or does not know) as one line on stderr
with exit status 2, before anything is written."""

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specdraft.__main__ import DEMO_PAIR
from specdraft.__main__ import main as specdraft_main

COMMANDS = ("demo", "capture", "eval")
ROOT = Path(__file__).resolve().parents[1]


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_python_m_specdraft_help_lists_the_commands():
    done = subprocess.run([sys.executable, "-m", "specdraft", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for command in COMMANDS:
        assert command in done.stdout


def test_help_loads_no_model_training_or_generation_code():
    """--help of each entry point answers before the heavy imports: not even torch
    (the package's names load lazily), so it answers at once."""
    script = textwrap.dedent(
        """
        import runpy, sys
        for module in ("specdraft", "specdraft.demo", "specdraft.capture", "specdraft.eval"):
            sys.argv = ["x", "--help"]
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as exit:
                assert exit.code in (0, None), (module, exit.code)
        heavy = ("torch", "specdraft.ops", "specdraft.assets", "specdraft.models", "specdraft.training",
                 "specdraft.generation", "matplotlib")
        print("LOADED", [name for name in heavy if name in sys.modules])
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("command", COMMANDS)
def test_the_dispatcher_runs_each_command_under_its_name(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        specdraft_main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"usage: specdraft {command}" in capsys.readouterr().out


def test_an_unknown_command_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        specdraft_main(["train"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'train'" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_text(command):
    parser = importlib.import_module(f"specdraft.{command}").build_parser()
    options = {action.dest: action.help for action in parser._actions}
    assert "device" in options and "no_progress" in options
    assert all(options.values()), [name for name, text in options.items() if not text]


def test_the_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"specdraft": "specdraft.__main__:main"}


def test_demo_pair_path_is_the_packages():
    from specdraft.assets import DEMO_PAIR as assets_demo_pair

    assert DEMO_PAIR == assets_demo_pair


def argv_for(command: str, tmp_path: Path) -> list[str]:
    """Arguments that pass every check made before the device's."""
    if command == "demo":
        return ["--no-progress"]
    if command == "capture":
        text = tmp_path / "a.py"
        text.write_bytes(b"x = 1\n" * 4)
        return ["demo", str(tmp_path / "out"), "--files", str(text), "--seq-len", "8", "--no-progress"]
    shard = tmp_path / "shard.safetensors"
    save_file({"token_ids": torch.zeros(4, dtype=torch.int64)}, str(shard))
    return ["demo", str(shard), "--eager", "--no-progress"]


DEVICES = ["foo", "cuda:x"] + ([] if torch.cuda.is_available() else ["cuda"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_device_this_machine_lacks_is_one_line_and_exit_2(command, device, tmp_path, capsys):
    main = importlib.import_module(f"specdraft.{command}").main
    threads = torch.get_num_threads()
    try:
        assert main([*argv_for(command, tmp_path), "--device", device]) == 2
    finally:
        torch.set_num_threads(threads)
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: --device")
    assert ("no CUDA device" in line) if device == "cuda" else ("unknown device" in line)
    assert not (tmp_path / "out").exists()


# Bad arguments no model is needed for: refused by the parser, before torch or the
# models load, each in one line with exit status 2. (argv, what the line must say)
REFUSED = [
    (["demo", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["demo", "--threads", "-3"], "--threads must be >= 1, got -3"),
    (["capture", "demo", "OUT", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["eval", "demo", "DATA", "--threads", "-1"], "--threads must be >= 1, got -1"),
    (["demo", "--k", "100000"], "--k must be in [1, 159] (--max-new-tokens - 1"),
    (["demo", "--k", "40", "--max-new-tokens", "32"], "--k must be in [1, 31]"),
    (["demo", "--tree", "4,4,16", "--k", "3"], "--k and --tree 4,4,16: the tree's depth is its K"),
    (["demo", "--tree", "AUTO"], "--tree must be auto or three integers D,K,N"),
    (["demo", "--tree", "4,4"], "--tree must be auto or three integers D,K,N"),
    # Well formed, out of range: TreeShape's own checks, which import no torch.
    (["demo", "--tree", "9,2,4"], "--tree 9,2,4: depth must be in [1, 8], got 9"),
    (["demo", "--tree", "2,2,40"], "--tree 2,2,40: num_verify_tokens: 40 needs 39 drafted nodes"),
    # Block drafters: no tree, K at most the block (read from the shipped config.json, no torch).
    (["demo", "--drafter", "dspark", "--tree", "4,4,16"], "--tree 4,4,16 with --drafter dspark: a block drafter"),
    (["demo", "--drafter", "dflash", "--tree", "auto"], "--tree auto with --drafter dflash: a block drafter"),
    (["demo", "--drafter", "dspark", "--k", "9"], "--k 9 with --drafter dspark: a block drafts at most its block size"),
    (["demo", "--drafter", "eagle"], "argument --drafter: invalid choice: 'eagle'"),
    # Budgeted verification: an int >= 0 or auto (calibration: chains and blocks only; auto with a tree: the
    # shipped tree costs' shape).
    (["demo", "--budget", "-1"], "--budget must be auto or an int >= 0, got -1"),
    (["demo", "--budget", "half"], "--budget must be auto or an int >= 0, got 'half'"),
    (
        ["demo", "--budget", "auto", "--tree", "3,2,6"],
        "--budget auto with --tree 3,2,6: the demo pair's tree costs were measured with --tree 4,4,16",
    ),
    (["demo", "--budget", "4", "--tree", "auto"], "--budget 4 with --tree auto: an int budget counts drafts or tree"),
    (
        ["demo", "--budget", "auto", "--tree", "auto", "--calibration", "0.5"],
        "--calibration with --tree auto --budget auto: the tree may be chosen",
    ),
    (["demo", "--budget", "4", "--tree", "4,4,16", "--calibration", "0.5"], "--calibration with --tree 4,4,16"),
    (["demo", "--calibration", "0.5"], "--calibration calibrates a budget's survival estimates: pass --budget"),
    (["demo", "--budget", "4", "--calibration", "0"], "--calibration must be in (0, 1] (the newest pass's weight)"),
    (["demo", "--budget", "4", "--calibration", "1.5"], "--calibration must be in (0, 1]"),
    # Truncation of the sampled run.
    (["demo", "--top-p", "0"], "--top-p must be in (0, 1] (1: off), got 0.0"),
    (["demo", "--min-p", "1.5"], "--min-p must be in [0, 1] (0: off), got 1.5"),
]

REFUSED_SCRIPT = textwrap.dedent(
    """
    import contextlib, io, json, sys, time
    from specdraft.__main__ import main
    results = []
    for argv in json.loads(sys.argv[1]):
        err = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exit:
                code = exit.code
        results.append({"code": code, "err": err.getvalue(), "seconds": time.perf_counter() - start})
    heavy = ("torch", "specdraft.assets", "specdraft.models", "specdraft.generation", "specdraft.proposers")
    print(json.dumps({"results": results, "loaded": [name for name in heavy if name in sys.modules]}))
    """
)


def test_bad_arguments_are_refused_in_one_line_within_a_second_before_torch_loads():
    """Every case of REFUSED in one fresh interpreter: exit status 2, one line naming
    the bound or the conflict, under a second each, and torch never imported."""
    import json

    argvs = [argv for argv, _ in REFUSED]
    done = subprocess.run(
        [sys.executable, "-c", REFUSED_SCRIPT, json.dumps(argvs)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for (argv, message), got in zip(REFUSED, report["results"], strict=True):
        assert got["code"] == 2, (argv, got)
        line = one_error_line(got["err"])
        assert message in line, (argv, line)
        assert got["seconds"] < 1, (argv, got["seconds"])
    assert report["loaded"] == []


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_the_same_threads_option(command):
    from specdraft.__main__ import THREADS_HELP

    parser = importlib.import_module(f"specdraft.{command}").build_parser()
    threads = parser._option_string_actions["--threads"]
    assert (threads.default, threads.type, threads.help) == (1, int, THREADS_HELP)


def test_capture_sets_the_cpu_threads(tmp_path):
    from specdraft.capture import main

    text = tmp_path / "a.py"
    text.write_bytes(b"x = 1\n" * 8)
    threads = torch.get_num_threads()
    try:
        argv = ["demo", str(tmp_path / "out"), "--files", str(text), "--seq-len", "16", "--no-progress"]
        assert main([*argv, "--threads", "2"]) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("command", ["demo", "eval"])
def test_output_options_say_their_folders_are_created(command):
    parser = importlib.import_module(f"specdraft.{command}").build_parser()
    for option in ("--json", "--plot") if command == "eval" else ("--json",):
        assert "folder is created if missing" in parser._option_string_actions[option].help


def test_demo_help_says_where_make_demo_and_the_training_script_live(capsys):
    with pytest.raises(SystemExit):
        specdraft_main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "make demo" in out and "scripts/train_demo_pair.py" in out
    assert "in a clone of the project's source repository, not in the wheel" in out
