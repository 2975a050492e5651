"""`torchrun --nproc-per-node N -m specdraft.eval`: N gloo processes on the demo
pair's captured shards report the same sums as one process (exact: the sums are on
a float64 grid, training.metrics), also when N does not divide the shards and when
a rank gets none; a rank that fails stops every rank with one line from rank 0; an
unwritable --json fails before any evaluation. The shard split is checked against
the bound that the longest-first rule guarantees (Graham: makespan <= 4/3 of the
optimum), the optimum found by brute force."""

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from specdraft.capture import main as capture
from specdraft.training.distributed import shard_tokens, share_shards

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is not built into this torch",
)
TIMEOUT_S = 120  # a hang fails the test instead of stalling the suite


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """3 shards of 2, 2 and 1 sequences of 96 bytes from the shipped target."""
    folder = tmp_path_factory.mktemp("captured")
    argv = ["demo", str(folder), "--seq-len", "96", "--per-shard", "2", "--max-sequences", "5", "--no-progress"]
    assert capture(argv) == 0
    return folder


def run_eval(args, nproc=None, module="specdraft.eval"):
    """The eval CLI in a subprocess, alone or under torchrun (standalone: a free port)."""
    launch = [sys.executable, "-m", module]
    if nproc is not None:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                  "-m", module]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([*launch, *args], capture_output=True, text=True, timeout=TIMEOUT_S, env=env, check=False)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_ranks_report_one_process_sums(shards, tmp_path, nproc=2):
    """3 shards on 2 ranks (N does not divide them); sampled Σ min(p, q) and the
    divergences are float sums, the counts integers: all equal exactly."""
    common = ["demo", str(shards), "--steps", "3", "--temperature", "0.7", "--divergence", "--eager",
              "--no-progress"]  # fmt: skip
    one = run_eval([*common, "--json", str(tmp_path / "one.json")])
    many = run_eval([*common, "--json", str(tmp_path / "many.json")], nproc=nproc)
    assert one.returncode == 0, one.stderr
    assert many.returncode == 0, many.stderr
    single, ranked = (json.loads((tmp_path / name).read_text()) for name in ("one.json", "many.json"))
    assert ranked["sums"] == single["sums"]
    assert ranked["timing"]["tokens"] == single["timing"]["tokens"] == 5 * 96
    assert ranked["timing"]["ranks"] == nproc
    assert many.stdout.count("greedy acceptance length") == 1  # rank 0 alone prints
    assert f"{nproc} ranks" in many.stdout


def test_a_rank_without_shards(shards, tmp_path):
    """One shard, two ranks: rank 1 evaluates nothing and contributes zero sums. The
    console entry (`python -m specdraft eval`) runs the same path."""
    shard = sorted(shards.glob("*.safetensors"))[0]
    common = ["demo", str(shard), "--steps", "2", "--eager", "--no-progress"]
    one = run_eval([*common, "--json", str(tmp_path / "one.json")])
    two = run_eval(["eval", *common, "--json", str(tmp_path / "two.json")], nproc=2, module="specdraft")
    assert one.returncode == 0 and two.returncode == 0, (one.stderr, two.stderr)
    single, ranked = (json.loads((tmp_path / name).read_text()) for name in ("one.json", "two.json"))
    assert ranked["sums"] == single["sums"]
    assert single["sums"]["count"][0] > 0


def test_a_failing_rank_stops_every_rank(shards, tmp_path):
    """Two shards of equal length: the second goes to rank 1, and it lacks
    target_logits. Rank 1 fails while loading it; rank 0 finishes its own and
    reports rank 1's error in one line; nobody waits for the group's timeout."""
    good, bad = sorted(shards.glob("*.safetensors"))[:2]
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.safetensors").write_bytes(good.read_bytes())
    tensors = load_file(bad)
    del tensors["target_logits"]
    save_file(tensors, data / "b.safetensors")
    assert share_shards([shard_tokens(data / "a.safetensors"), shard_tokens(data / "b.safetensors")], 2) == [[0], [1]]
    result = run_eval(["demo", str(data), "--eager", "--no-progress"], nproc=2)
    assert result.returncode != 0
    lines = error_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert "rank 1" in lines[0] and "target_logits" in lines[0] and "missing" in lines[0]
    assert "greedy acceptance length" not in result.stdout


def test_unwritable_json_fails_before_evaluating(shards, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_eval(["demo", str(shards), "--no-progress", "--json", str(blocker / "out.json")], nproc=2)
    assert result.returncode != 0
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "--json" in lines[0] and "cannot be written" in lines[0], result.stderr
    assert "compiling" not in result.stderr and result.stdout == ""


def optimal_makespan(counts, world_size):
    return min(
        max(sum(c for c, r in zip(counts, assignment, strict=True) if r == rank) for rank in range(world_size))
        for assignment in itertools.product(range(world_size), repeat=len(counts))
    )


@given(
    counts=st.lists(st.integers(0, 5000), min_size=0, max_size=7),
    world_size=st.integers(1, 4),
)
def test_share_shards_balances_tokens(counts, world_size):
    shares = share_shards(counts, world_size)
    assert len(shares) == world_size
    assert sorted(i for share in shares for i in share) == list(range(len(counts)))  # each shard once
    assert all(share == sorted(share) for share in shares)
    loads = [sum(counts[i] for i in share) for share in shares]
    if counts:
        assert 3 * world_size * max(loads) <= (4 * world_size - 1) * optimal_makespan(counts, world_size)
    assert share_shards(counts, world_size) == shares  # every rank computes the same split


def test_share_shards_refuses_no_ranks():
    with pytest.raises(ValueError, match="world_size"):
        share_shards([1, 2], 0)
