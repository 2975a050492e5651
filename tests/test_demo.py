"""`make demo` (specdraft.demo.main), run in-process, eagerly and at small sizes: it
finds plain and speculative greedy decoding identical, prints acceptance lengths
above 1 (the shipped head agrees with its target), and fails loudly when the two
decodings differ. Its progress bars are labelled by run, a compile is announced on
stderr, and --no-progress leaves stderr empty. --drafter dflash / dspark runs the
shipped block drafters the same way (K = their block by default; --tree and a K past
the block refused)."""

import argparse
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from specdraft import demo
from specdraft.generation import SpeculativeDecoder

SMALL = ["--no-compile", "--prompts", "3", "--max-new-tokens", "48", "--k", "3"]


def run_demo(capsys, argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr)."""
    threads = torch.get_num_threads()
    try:
        status = demo.main(argv)
    finally:
        torch.set_num_threads(threads)  # main sets the CPU thread count
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in the demo's output:\n{text}"
    return float(match.group(1).replace(",", ""))


def test_demo_finds_identical_outputs_and_accepts_drafts(capsys):
    status, out, err = run_demo(capsys, [*SMALL, "--no-progress"])
    assert status == 0, out
    assert err == ""  # --no-progress: no bars, no status lines
    assert "greedy outputs identical: yes (3 prompts, 144 tokens" in out
    rates = [float(r) for r in re.findall(r"k=\d: ([0-9.]+)", out)]
    assert len(rates) == 3 and all(0 < r <= 1 for r in rates)
    assert rates == sorted(rates, reverse=True)  # a draft is accepted only after the ones before it
    assert number(r"mean acceptance length\s+([0-9.]+)", out) > 1.5
    assert 1 < number(r"mean tokens per verify pass\s+([0-9.]+)", out) <= 4
    passes = re.search(r"target verify passes\s+speculative (\d+), plain (\d+)", out)
    assert passes and int(passes.group(1)) < int(passes.group(2))
    assert number(r"speedup ([0-9.]+)x", out) > 0
    assert "sampled run (temperature 0.7" in out
    assert number(r"sampled run .*mean acceptance length ([0-9.]+)", out) > 1


def test_compiled_demo_finds_identical_outputs(capsys):
    """`make demo` as shipped: both iterations compiled with the demo's options (the
    wheel smoke step runs the installed package with --no-compile). K = 1: one draft
    step unrolled in the speculative graph, the cheapest compile of the same code."""
    status, out, _ = run_demo(capsys, ["--prompts", "2", "--max-new-tokens", "24", "--k", "1", "--no-progress"])
    assert status == 0, out
    assert "torch.compile(fullgraph=True" in out
    assert "greedy outputs identical: yes (2 prompts, 48 tokens" in out
    assert number(r"mean acceptance length\s+([0-9.]+)", out) > 1


def drop_a_speculative_token(monkeypatch) -> None:
    """Make every speculative generate drop request 1's first token (the plain run
    stays as it is), so the demo's identity check must fail."""
    real = SpeculativeDecoder.generate

    def lossy(self, prompts, **kwargs):
        result = real(self, prompts, **kwargs)
        if self.proposer is not None and kwargs.get("max_new_tokens", 0) > 2:
            result.tokens[1] = result.tokens[1][1:]
        return result

    monkeypatch.setattr(SpeculativeDecoder, "generate", lossy)


def test_demo_exits_non_zero_when_outputs_differ(capsys, monkeypatch):
    """A speculative decoder that drops one token is caught."""
    drop_a_speculative_token(monkeypatch)
    status, out, _ = run_demo(capsys, [*SMALL, "--no-sampled", "--no-progress"])
    assert status == 1
    assert "FAIL: greedy outputs differ (prompt 2" in out


def test_demo_refuses_sizes_it_cannot_hold():
    with pytest.raises(SystemExit):
        demo.parse_args(["--max-new-tokens", "100000"])
    with pytest.raises(SystemExit):
        demo.parse_args(["--prompts", "0"])


def test_progress_bars_are_labelled_and_the_compiles_announced(capsys, monkeypatch):
    """torch.compile stubbed out (the iterations run eagerly): what is checked is
    what stderr shows around the compiling first runs, and the bars' labels."""
    monkeypatch.setattr(torch, "compile", lambda fn, **options: fn)
    status, out, err = run_demo(capsys, ["--prompts", "2", "--max-new-tokens", "16", "--k", "2"])
    assert status == 0, out
    for name in ("plain", "speculative"):
        assert f"compiling the {name} iteration (one-time, ~20-60 s on CPU)..." in err
    assert err.count("compiled in ") == 2
    for label in ("plain", "speculative", "sampled"):
        assert f"{label}: 100%" in err, err
    assert "generate:" not in err


def test_bad_input_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--k", "0"])
    assert exit_info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_demo_with_a_tree(capsys):
    """--tree D,K,N: identical greedy outputs, per-depth acceptance falling with depth,
    accepted nodes by sibling rank, a mean acceptance length within D + 1, and the
    sampled run through the tree verifier."""
    status, out, err = run_demo(capsys, ["--no-compile", "--prompts", "3", "--max-new-tokens", "48", "--tree", "4,4,16",
                                         "--no-progress"])  # fmt: skip
    assert status == 0, out
    assert "tree depth 4, topk 4, 16 verified tokens" in out
    assert "greedy outputs identical: yes (3 prompts, 144 tokens" in out
    rates = [float(r) for r in re.findall(r"d=\d: ([0-9.]+)", out)]
    assert len(rates) == 4 and rates == sorted(rates, reverse=True) and rates[0] > 0
    ranks = [
        int(n) for n in re.findall(r"(?<=  )\d: (\d+)", out.split("accepted nodes by sibling rank")[1].split("\n")[0])
    ]
    assert len(ranks) == 4 and sum(ranks) > 0
    assert 1.5 < number(r"mean acceptance length\s+([0-9.]+)", out) <= 5
    assert number(r"sampled run .*mean acceptance length ([0-9.]+)", out) > 1


@pytest.mark.parametrize("tree", ["4,4", "a,b,c", "9,2,4", "2,2,9"])
def test_bad_trees_are_refused(tree, capsys):
    with pytest.raises(SystemExit):
        demo.parse_args(["--tree", tree])
    assert "--tree" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("prompts", "tree", "k"),
    [(1, None, 3), (2, None, 2), (6, (3, 4, 8), 2)],
    ids=["B1-chain", "B2-plain-table", "B6-tree"],
)
def test_tree_auto_follows_the_measured_table(prompts, tree, k, capsys):
    """--tree auto (with --k 2) at B = 1: the table's chain (K = 3); at B = 2 the table
    picks plain decoding, so the demo keeps its chain of --k; at B = 6 (the next row:
    8) the tree 3,4,8."""
    args = demo.parse_args(["--tree", "auto", "--prompts", str(prompts), "--k", "2"])
    demo.choose_drafts(args, prompts)
    got = None if args.tree is None else (args.tree.depth, args.tree.topk, args.tree.num_verify_tokens)
    assert (got, args.k) == (tree, k)
    assert f"at B = {prompts} the measured table picks" in capsys.readouterr().out


def printed_rate(label: str, out: str) -> tuple[float, float, float]:
    """(plain, speculative, speedup) of a printed tokens/s line."""
    match = re.search(rf"{re.escape(label)}\s+plain ([0-9,]+)\s+speculative ([0-9,]+)\s+speedup ([0-9.]+)x", out)
    assert match, f"{label!r} not in the demo's output:\n{out}"
    return tuple(float(g.replace(",", "")) for g in match.groups())


def test_demo_json_holds_what_it_printed(tmp_path, capsys):
    """--json (into folders that do not exist yet): every statistic equals the printed
    line it stands for, at the printed precision."""
    path = tmp_path / "new" / "stats.json"
    status, out, _ = run_demo(capsys, [*SMALL, "--no-progress", "--json", str(path)])
    assert status == 0, out
    assert f"wrote {path}" in out
    got = json.loads(path.read_text())
    assert got["greedy_identical"] is True and got["first_difference"] is None
    assert "greedy outputs identical: yes (3 prompts, 144 tokens" in out and got["tokens"] == 144
    assert (got["k"], got["tree"], got["prompts"], got["max_new_tokens"], got["compiled"]) == (3, None, 3, 48, False)
    assert got["drafter"] == "eagle3"
    rates = [float(r) for r in re.findall(r"k=\d: ([0-9.]+)", out)]
    assert [round(r, 3) for r in got["acceptance_rate_per_position"]] == rates
    assert got["accepted_sibling_rank"] is None
    assert round(got["mean_acceptance_length"], 3) == number(r"mean acceptance length\s+([0-9.]+)", out)
    assert round(got["tokens_per_verify_pass_per_request"], 3) == number(
        r"mean tokens per verify pass\s+([0-9.]+)", out
    )
    assert round(got["tokens_per_batched_verify_pass"], 2) == number(r"; ([0-9.]+) per batched target pass", out)
    passes = re.search(r"target verify passes\s+speculative (\d+), plain (\d+)", out)
    assert got["verify_passes"] == {"speculative": int(passes.group(1)), "plain": int(passes.group(2))}
    for key, label in (("decode_tokens_per_s", "tokens/s (decode)"), ("tokens_per_s", "tokens/s (prefill included)")):
        plain, spec, speedup = printed_rate(label, out)
        rate = got[key]
        assert (round(rate["plain"]), round(rate["speculative"]), round(rate["speedup"], 2)) == (plain, spec, speedup)
    sampled = number(r"sampled run .*mean acceptance length ([0-9.]+)", out)
    assert got["sampled"]["temperature"] == 0.7 and got["sampled"]["seeds"] == [0, 2]
    assert round(got["sampled"]["mean_acceptance_length"], 3) == sampled


@pytest.mark.parametrize("drafter", ["dflash", "dspark"])
def test_block_drafter_demo_finds_identical_outputs(drafter, tmp_path, capsys):
    """--drafter dflash / dspark: the shipped block drafter, K = its block size (7) by
    default, greedy outputs identical to plain decoding, per-position acceptance
    falling with the position, the --json record holding the printed statistics
    under the same keys as EAGLE-3's, and the sampled run."""
    path = tmp_path / "stats.json"
    argv = ["--no-compile", "--prompts", "3", "--max-new-tokens", "48", "--drafter", drafter, "--no-progress"]
    status, out, err = run_demo(capsys, [*argv, "--json", str(path)])
    assert status == 0, out
    assert err == ""
    name = {"dflash": "DFlash", "dspark": "DSpark"}[drafter]
    assert f"specdraft demo: {name} speculative decoding" in out
    assert f"{name} head (2 layers, block 7" in out and "K = 7;" in out
    assert ("Markov rank 64" in out) == (drafter == "dspark")
    assert "greedy outputs identical: yes (3 prompts, 144 tokens" in out
    rates = [float(r) for r in re.findall(r"k=\d: ([0-9.]+)", out)]
    assert len(rates) == 7 and all(0 <= r <= 1 for r in rates) and rates[0] > 0
    assert rates == sorted(rates, reverse=True)
    length = number(r"mean acceptance length\s+([0-9.]+)", out)
    assert 1 < length <= 8
    passes = re.search(r"target verify passes\s+speculative (\d+), plain (\d+)", out)
    assert passes and int(passes.group(1)) < int(passes.group(2))
    assert number(r"sampled run .*mean acceptance length ([0-9.]+)", out) >= 1
    got = json.loads(path.read_text())
    assert (got["drafter"], got["k"], got["tree"], got["compiled"]) == (drafter, 7, None, False)
    assert got["greedy_identical"] is True and got["tokens"] == 144
    assert [round(r, 3) for r in got["acceptance_rate_per_position"]] == rates
    assert round(got["mean_acceptance_length"], 3) == length
    assert got["accepted_sibling_rank"] is None and got["sampled"]["temperature"] == 0.7


def test_block_drafter_demo_takes_a_shorter_k(capsys):
    """--k below the block size: the block's first K drafts are verified."""
    argv = ["--no-compile", "--prompts", "2", "--max-new-tokens", "24", "--drafter", "dspark", "--k", "2"]
    status, out, _ = run_demo(capsys, [*argv, "--no-sampled", "--no-progress"])
    assert status == 0, out
    assert "K = 2;" in out and "greedy outputs identical: yes (2 prompts, 48 tokens" in out
    assert len(re.findall(r"k=\d: ([0-9.]+)", out)) == 2
    assert number(r"mean acceptance length\s+([0-9.]+)", out) <= 3


def test_block_drafter_demo_exits_non_zero_when_outputs_differ(capsys, monkeypatch):
    drop_a_speculative_token(monkeypatch)
    argv = ["--no-compile", "--prompts", "3", "--max-new-tokens", "24", "--drafter", "dflash"]
    status, out, _ = run_demo(capsys, [*argv, "--no-sampled", "--no-progress"])
    assert status == 1
    assert "FAIL: greedy outputs differ (prompt 2" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--drafter", "dspark", "--tree", "4,4,16"], "--tree 4,4,16 with --drafter dspark: a block drafter drafts"),
        (["--drafter", "dflash", "--tree", "auto"], "--tree auto with --drafter dflash"),
        (["--drafter", "dflash", "--k", "8"], "--k 8 with --drafter dflash: a block drafts at most its block size, 7"),
        (["--drafter", "medusa"], "argument --drafter: invalid choice: 'medusa'"),
    ],
)
def test_block_drafter_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_block_drafter_k_defaults_to_the_block_and_the_run():
    assert demo.parse_args(["--drafter", "dspark"]).k == 7
    assert demo.parse_args(["--drafter", "dspark", "--max-new-tokens", "5"]).k == 4  # a run keeps at most 4 drafts
    assert demo.parse_args([]).k == demo.DEFAULT_K and demo.parse_args([]).drafter == "eagle3"


def test_the_chain_on_cuda_defaults_to_the_deeper_k():
    """On CUDA the plain chain demo drafts DEFAULT_K_CUDA (5, the demo pair's fastest
    chain there); with a tree or a budget, whose tables were measured at K = 3, and on
    the CPU, DEFAULT_K; an explicit --k wins everywhere."""
    assert (demo.DEFAULT_K, demo.DEFAULT_K_CUDA) == (3, 5)
    assert demo.parse_args(["--device", "cuda"]).k == 5
    assert demo.parse_args(["--device", "cuda:1"]).k == 5
    assert demo.parse_args(["--device", "cuda", "--k", "2"]).k == 2
    assert demo.parse_args(["--device", "cuda", "--budget", "auto"]).k == 3
    assert demo.parse_args(["--device", "cuda", "--tree", "auto"]).k == 3
    assert demo.parse_args(["--device", "cuda", "--tree", "4,4,16"]).tree.depth == 4
    assert demo.parse_args(["--device", "cpu"]).k == 3


def test_demo_with_a_calibrated_budget(tmp_path, capsys):
    """--budget 3 --calibration 0.5: identical greedy outputs, the budget and the
    calibration named in the header and recorded in --json."""
    path = tmp_path / "stats.json"
    argv = [*SMALL, "--no-progress", "--no-sampled", "--budget", "3", "--calibration", "0.5", "--json", str(path)]
    status, out, _ = run_demo(capsys, argv)
    assert status == 0, out
    assert "greedy outputs identical: yes" in out
    assert "K = 3, budget 3, calibration 0.5" in out
    got = json.loads(path.read_text())
    assert got["budget"] == 3 and got["calibration"] == 0.5 and got["greedy_identical"]


def test_demo_takes_a_tree_budget_from_the_tree_costs(tmp_path, capsys):
    """--budget auto --tree 4,4,16: the shipped tree costs' choice at this batch size,
    named before the run and recorded (run_as) in --json; greedy outputs identical."""
    from specdraft.generation.tree_costs import demo_pair_tree_costs

    path = tmp_path / "stats.json"
    argv = [*SMALL[:-2], "--no-progress", "--no-sampled", "--tree", "4,4,16", "--budget", "auto", "--json", str(path)]
    status, out, _ = run_demo(capsys, argv)
    assert status == 0, out
    assert "greedy outputs identical: yes" in out
    got = json.loads(path.read_text())
    nodes = demo_pair_tree_costs().choose(got["prompts"])
    assert got["budget"] == (None if nodes == 0 else nodes) and got["greedy_identical"]  # plain: no budget
    assert "the tree costs measured on the" in out
    want = "the whole tree 4,4,16" if nodes is None else "plain decoding" if nodes == 0 else f"budget {nodes} nodes"
    assert want in got["run_as"]


def test_demo_takes_the_chain_or_the_tree_that_its_tables_predict_faster(tmp_path, capsys):
    """--tree auto --budget auto: the two shipped tables' predictions printed, the
    larger one's decoder run (a tree shape in --json where the tree is faster, none
    for the chain), greedy outputs identical."""
    path = tmp_path / "stats.json"
    argv = [*SMALL[:-2], "--no-progress", "--no-sampled", "--tree", "auto", "--budget", "auto", "--json", str(path)]
    status, out, _ = run_demo(capsys, argv)
    assert status == 0, out
    assert "greedy outputs identical: yes" in out
    said = re.search(r"predict ([\d,]+) tokens/s for the chain, the tree costs ([\d,]+) for the tree 4,4,16: the "
                     r"(chain|tree)", out)  # fmt: skip
    chain, tree = (float(said.group(i).replace(",", "")) for i in (1, 2))
    assert said.group(3) == ("tree" if tree > chain else "chain")
    got = json.loads(path.read_text())
    assert (got["tree"] == [4, 4, 16]) == (said.group(3) == "tree") and got["greedy_identical"]


@pytest.mark.parametrize("num_requests", [1, 2, 3, 64])
def test_chain_or_tree_takes_the_tree_only_when_it_is_predicted_faster(num_requests, capsys):
    """The demo's --tree auto --budget auto pick: the tree where its prediction is the
    larger, the chain otherwise (a tie included: at B = 2 both tables predict plain
    decoding's rate)."""
    from specdraft.demo import choose_chain_or_tree

    args = argparse.Namespace(tree="auto")
    choose_chain_or_tree(args, num_requests)
    said = re.search(r"predict ([\d,]+) tokens/s for the chain, the tree costs ([\d,]+) for the tree 4,4,16: the "
                     r"(chain|tree)", capsys.readouterr().out)  # fmt: skip
    chain, tree = (float(said.group(i).replace(",", "")) for i in (1, 2))
    assert said.group(3) == ("tree" if tree > chain else "chain")
    assert (args.tree is not None) == (tree > chain)


def test_demo_json_records_a_failed_identity_check(tmp_path, capsys, monkeypatch):
    drop_a_speculative_token(monkeypatch)
    path = tmp_path / "stats.json"
    status, out, _ = run_demo(capsys, [*SMALL, "--no-sampled", "--no-progress", "--json", str(path)])
    assert status == 1
    failed = re.search(r"FAIL: greedy outputs differ \(prompt (\d+), token (\d+)\)", out)
    got = json.loads(path.read_text())
    assert got["greedy_identical"] is False
    assert got["first_difference"] == {"prompt": int(failed.group(1)), "token": int(failed.group(2))}
    assert "mean_acceptance_length" not in got


def test_demo_options_leave_later_compiles_vectorised(tmp_path):
    """A compile with the demo's CPU options must not change how later compiles of the
    process lower: CPU flex_attention (the training evaluator's attention) needs the
    vector ISA, and with cpp.vec_isa_ok=False as the process's first compile
    Inductor cached "no vector ISA" for the whole process and refused to lower it
    (the CPU lane failed this way whenever the demo-options tree test ran on the
    flex tests' worker first). A fresh process: the probe runs once per process."""
    script = """
import torch
from torch.nn.attention.flex_attention import flex_attention
from specdraft.demo import compile_options
scalar = torch.compile(lambda x: x.sin() * 2, **compile_options("cpu", True))
scalar(torch.randn(64))
q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))  # torch 2.11's CPU flex refuses q is k is v
out = torch.compile(flex_attention)(q, k, v)
torch.testing.assert_close(out, flex_attention(q, k, v))
print("ok")
"""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


@pytest.mark.parametrize(
    "options, graphs",
    [
        ({"mode": "reduce-overhead"}, True),
        ({"mode": "max-autotune"}, True),
        ({"options": {"triton.cudagraphs": True, "loop_ordering_after_fusion": False}}, True),
        ({"mode": "max-autotune-no-cudagraphs"}, False),
        ({"options": {"triton.cudagraphs": False}}, False),
        ({"options": {"cpp.simdlen": 0}}, False),
        ({"backend": "aot_eager"}, False),
        ({}, False),
        (None, False),
    ],
)
def test_the_generate_loop_knows_when_the_iteration_replays_cuda_graphs(options, graphs):
    """generate marks each iteration's start and copies the state out of the graphs'
    memory exactly when the options record CUDA graphs, whichever way they say it:
    the demo's CUDA options say it as Inductor's triton.cudagraphs, since
    torch.compile takes no other option beside a mode."""
    from specdraft.generation.state import captures_cuda_graphs

    assert captures_cuda_graphs(options) is graphs


def test_the_demos_cuda_options_record_cuda_graphs():
    from specdraft.generation.state import captures_cuda_graphs

    assert captures_cuda_graphs(demo.compile_options("cuda", True))
    assert not captures_cuda_graphs(demo.compile_options("cpu", True))
    assert demo.compile_options("cuda", False) is False
