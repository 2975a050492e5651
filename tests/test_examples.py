"""examples/train_eagle3_head.py, run in-process with tiny settings (30 steps
of 6 short windows, evaluated eagerly: the compiled evaluator is
tests/training/test_evaluate.py's):

- its loss is a plain loop's: over every step k and start t whose row t + k + 1
  lies in t's sequence, -Σ softmax(target row t + k + 1) · log_softmax(draft);
- it writes a PNG and a JSON log that holds what main returned;
- distillation learns: the loss of the last steps is well below the first steps'
  (from a fresh head), and the held-out acceptance length rises from near zero;
- every recorded evaluation obeys the metric's definition: 0 <= acceptance length
  <= K, it is the sum of the rates "drafts 1..k all accepted", which cannot grow
  with k ("drafts 1..k+1 all accepted" implies "drafts 1..k all accepted");
- the saved head and held-out batch are what `python -m specdraft.eval` reads, and
  it reports the last in-training evaluation's numbers (the head saved is the one
  trained, the evaluation is the library's own).
"""

import json
from pathlib import Path

import pytest
import torch

from specdraft.assets import DEMO_PAIR
from specdraft.eval import main as eval_main

from fixtures.scripts import load_script

K = 2
STEPS = 30


example = load_script("examples/train_eagle3_head.py")


def test_loss_is_the_plain_loops():
    target = example.frozen_target("cpu")
    head = example.fresh_head(target, seed=5, device="cpu")
    text = torch.tensor(list(Path(__file__).read_bytes()[:14]))
    lengths, num_steps = (9, 5), 3
    batch = example.capture(target, [text[:9], text[9:14]])
    loss, per_step = example.distill_loss(head, batch, num_steps)
    logits = example.unroll(head, *batch.unroll_args(), num_steps=num_steps, tokens="data").logits
    want, begin = [[] for _ in range(num_steps)], 0
    for n in lengths:
        for t in range(begin, begin + n):
            for k in range(num_steps):
                if t + k + 1 < begin + n:
                    p = torch.softmax(batch.target_logits[t + k + 1].double(), -1)
                    want[k].append(-(p * torch.log_softmax(logits[k, t].double(), -1)).sum())
        begin += n
    want = torch.stack([torch.stack(w).mean() for w in want])
    torch.testing.assert_close(per_step.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss.double(), sum(0.8**k * want[k] for k in range(num_steps)), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train_eagle3_head")
    argv = ["--out", str(out), "--steps", str(STEPS), "--eval-every", "10", "--draft-steps", str(K), "--batch", "6",
            "--seq-len", "48", "--warmup", "4", "--eval-windows", "8", "--eager-eval", "--save-eval-data",
            "--no-progress", "--seed", "3"]  # fmt: skip
    return out, example.main(argv)


def test_writes_plot_and_log(run):
    out, log = run
    assert (out / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "log.json").read_text()) == json.loads(json.dumps(log))
    assert [e["step"] for e in log["evals"]] == [0, 10, 20, 30]
    assert len(log["loss"]) == STEPS and all(len(per_step) == K for per_step in log["loss_per_step"])


def test_distillation_learns(run):
    _, log = run
    first, last = log["loss"][:5], log["loss"][-5:]
    assert sum(last) < 0.7 * sum(first), log["loss"]  # seeds 0-4 give 0.51-0.56
    acceptance = [e["acceptance_length"] for e in log["evals"]]
    assert acceptance[0] < 0.1, acceptance  # a fresh head rarely agrees with the target
    assert acceptance[-1] > acceptance[0] + 0.2, acceptance


def test_evaluations_obey_the_definition(run):
    _, log = run
    for e in log["evals"]:
        assert 0.0 <= e["acceptance_length"] <= K
        assert 0.0 <= e["marginal_acceptance_length"] <= K
        assert e["acceptance_length"] == pytest.approx(sum(e["accepted_prefix_rate"]), abs=1e-9)
        rates = e["accepted_prefix_rate"]
        assert all(a >= b for a, b in zip(rates, rates[1:], strict=False)), rates
        assert rates[0] == pytest.approx(e["accuracy"][0], abs=0.05)  # full starts vs scored pairs: nearly the same set


def test_saved_head_reads_back_through_the_eval_cli(run, tmp_path):
    out, log = run
    report = tmp_path / "eval.json"
    argv = [str(out / "head"), str(out / "eval_data"), "--target", str(DEMO_PAIR / "target"), "--steps", str(K),
            "--eager", "--no-progress", "--json", str(report)]  # fmt: skip
    assert eval_main(argv) == 0
    metrics, last = json.loads(report.read_text()), log["evals"][-1]
    assert metrics["acceptance_length"] == pytest.approx(last["acceptance_length"], abs=1e-9)
    assert metrics["accuracy"] == pytest.approx(last["accuracy"], abs=1e-9)


BAD_ARGUMENTS = (["--steps", "0"], ["--eval-every", "0"], ["--draft-steps", "0"], ["--seq-len", "3"],
                 ["--seq-len", "2000"], ["--lr", "0"], ["--threads", "-1"])  # fmt: skip


@pytest.mark.parametrize("argv", BAD_ARGUMENTS)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        example.parse_args(argv)
    assert exit_info.value.code == 2
    assert argv[0] in capsys.readouterr().err
