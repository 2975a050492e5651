"""`python -m specdraft.capture`: the text's bytes cut into windows, packed into
shards that hold what capture_target_outputs returns for them; bad input exits with
an error naming the option (or the file), in one line, before OUT is created; runs
never mix (a non-empty OUT needs --overwrite, which clears the old shards)."""

import shutil

import pytest
import torch

from specdraft.assets import DEMO_PAIR, demo_held_out_files, load_demo_pair
from specdraft.capture import main
from specdraft.models import default_aux_layers
from specdraft.training import capture_target_outputs, load_batch, shard_metadata, shard_paths


def test_shards_hold_the_windows_and_the_targets_outputs(tmp_path):
    text = tmp_path / "a.py"
    text.write_bytes(bytes(range(32, 127)) * 3)  # 285 bytes
    other = tmp_path / "b.py"
    other.write_bytes(b"def f(x):\n    return x + 1\n" * 4)  # 108 bytes
    out = tmp_path / "data"
    assert main(["demo", str(out), "--files", str(text), str(other), "--seq-len", "64", "--per-shard", "2",
                 "--no-progress"]) == 0  # fmt: skip
    blob = text.read_bytes() + b"\n\n" + other.read_bytes()  # 395 bytes: 6 windows of 64
    windows = [torch.tensor(list(blob[i : i + 64])) for i in range(0, 6 * 64, 64)]
    paths = shard_paths(out)
    assert [p.name for p in paths] == ["shard-00000.safetensors", "shard-00001.safetensors", "shard-00002.safetensors"]
    target = load_demo_pair()[0]
    aux = default_aux_layers(target.config.num_layers)
    for i, path in enumerate(paths):
        got = load_batch(path)
        pair = windows[2 * i : 2 * i + 2]
        assert torch.equal(got.token_ids, torch.cat(pair))
        assert got.cu_seqlens.tolist() == [0, 64, 128]
        want = capture_target_outputs(target, pair, aux_layers=aux)
        torch.testing.assert_close(got.hidden_states, want.hidden_states)
        torch.testing.assert_close(got.target_logits, want.target_logits)
        assert shard_metadata(path)["aux_layers"] == str(list(aux))


def test_default_files_are_the_held_out_stdlib_files(tmp_path):
    if not demo_held_out_files():
        pytest.skip("this Python's stdlib has none of the demo pair's held-out files")
    out = tmp_path / "data"
    assert main(["demo", str(out), "--max-sequences", "3", "--seq-len", "32", "--no-progress"]) == 0
    first = demo_held_out_files()[0].read_bytes()[:32]
    assert load_batch(shard_paths(out)[0]).token_ids[:32].tolist() == list(first)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["somewhere", "OUT"], "--files is required unless TARGET is demo"),
        (["demo", "OUT", "--seq-len", "1"], "--seq-len must be >= 2"),
        (["demo", "OUT", "--per-shard", "0"], "--per-shard"),
    ],
)
def test_bad_options_exit_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_file_and_short_text(tmp_path, capsys):
    assert main(["demo", str(tmp_path / "out"), "--files", str(tmp_path / "none.py"), "--no-progress"]) == 2
    assert "none.py is not a file" in capsys.readouterr().err
    short = tmp_path / "short.py"
    short.write_bytes(b"x = 1\n")
    assert main(["demo", str(tmp_path / "out"), "--files", str(short), "--no-progress"]) == 2
    assert "fewer than one --seq-len window of 512" in capsys.readouterr().err


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "a.py"
    path.write_bytes(b"def f(x):\n    return x + 1\n" * 8)  # 224 bytes
    return path


def small(out, text, *more) -> list[str]:
    return [str(out), "--files", str(text), "--seq-len", "32", "--per-shard", "1", "--no-progress", *more]


def broken_target(tmp_path, file_name: str, content: bytes):
    folder = tmp_path / "target"
    shutil.copytree(DEMO_PAIR / "target", folder)
    (folder / file_name).write_bytes(content)
    return folder


@pytest.mark.parametrize(
    "file_name, content, message",
    [
        ("model.safetensors", b"not a safetensors file", "model.safetensors is not a readable safetensors file"),
        ("config.json", b'{"hidden_size": 256,', "config.json is not valid JSON"),
    ],
    ids=["corrupt-weights", "malformed-config"],
)
def test_a_broken_target_folder_names_the_file(tmp_path, text, capsys, file_name, content, message):
    folder = broken_target(tmp_path, file_name, content)
    out = tmp_path / "out"
    assert main([str(folder), *small(out, text)]) == 2
    line = error_line(capsys)
    assert str(folder / file_name) in line and message in line
    assert not out.exists()


def test_bad_arguments_leave_no_out_folder(tmp_path, text, capsys):
    out = tmp_path / "out"
    assert main(["demo", *small(out, text, "--aux-layers", "99")]) == 2
    assert "--aux-layers: layer 99 is not in [0, 4)" in error_line(capsys)
    assert main(["somewhere", *small(out, text)]) == 2
    assert "TARGET: somewhere is not a folder" in error_line(capsys)
    assert not out.exists()


def test_out_must_be_a_folder(tmp_path, text, capsys):
    out = tmp_path / "out"
    out.write_text("a file")
    assert main(["demo", *small(out, text)]) == 2
    assert "exists and is not a folder" in error_line(capsys)
    assert out.read_text() == "a file"


def test_a_non_empty_out_needs_overwrite_which_clears_the_old_shards(tmp_path, text, capsys):
    out = tmp_path / "out"
    assert main(["demo", *small(out, text, "--max-sequences", "3")]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == [f"shard-0000{i}.safetensors" for i in range(3)]
    capsys.readouterr()
    assert main(["demo", *small(out, text, "--max-sequences", "1")]) == 2
    assert "is not empty; pass --overwrite" in error_line(capsys)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched
    (out / "notes.txt").write_text("kept")
    assert main(["demo", *small(out, text, "--max-sequences", "1", "--overwrite")]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "shard-00000.safetensors"]
    assert [p.name for p in shard_paths(out)] == ["shard-00000.safetensors"]


def test_a_seq_len_longer_than_the_text_names_seq_len(tmp_path, capsys):
    """Without --files (the held-out stdlib files) the error blames --seq-len, not
    the --files the user did not pass."""
    if not demo_held_out_files():
        pytest.skip("this Python's stdlib has none of the demo pair's held-out files")
    out = tmp_path / "out"
    assert main(["demo", str(out), "--seq-len", "10000000", "--no-progress"]) == 2
    line = error_line(capsys)
    assert line.startswith("error: --seq-len 10000000: the demo's held-out stdlib files hold ")
    assert "--files" not in line
    assert not out.exists()


def test_a_draft_head_folder_as_target_names_target_and_the_folder(tmp_path, text, capsys):
    out = tmp_path / "out"
    head = DEMO_PAIR / "eagle3"
    assert main([str(head), *small(out, text)]) == 2
    line = error_line(capsys)
    assert line.startswith(f"error: TARGET: {head} does not hold a target model (")
    assert not out.exists()
