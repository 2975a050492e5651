"""Checked mode (specdraft.checked_mode): how it is turned on, that it refuses bad
values on every proposer's entry points, that it never refuses valid ones (every
proposer and path gives the same drafts in both modes, the internal op calls
checked too), and that the compiled path holds none of it: one compile with the
mode on, no check and no sync in the graph, and no recompile when it is toggled."""

import os
import subprocess
import sys

import pytest
import torch

import specdraft
from specdraft import checked_mode
from specdraft.checked_mode import ENV_VAR
from specdraft.config import SpeculativeConfig
from specdraft.models import TinyTargetModel
from specdraft.proposers import AutoregressiveSpeculator, DraftLM
from specdraft.testing import CompileCounts, fresh_compile

from fixtures.bad_input import build, padded_inputs, with_metadata
from fixtures.draft_heads import VOCAB, draft_config
from fixtures.multi_proposers import (
    make_multi_group,
    make_multi_layer,
    multi_group_calls,
    multi_layer_calls,
    propose_by_path,
)

# ----------------------------------------------------------------------- switching it


def test_env_var_turns_it_on_at_import(monkeypatch):
    code = "import specdraft; print(specdraft.is_checked())"
    env = {**os.environ, ENV_VAR: "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "True"
    for value, want in (("1", True), ("yes", True), ("0", False), ("off", False), ("", False)):
        monkeypatch.setenv(ENV_VAR, value)
        assert checked_mode.read_env() is want, value


def test_context_manager_and_setter_restore():
    before = specdraft.is_checked()
    with specdraft.checked():
        assert specdraft.is_checked()
        with specdraft.checked(False):
            assert not specdraft.is_checked()
        assert specdraft.is_checked()
    assert specdraft.is_checked() == before
    previous = specdraft.set_checked(True)
    try:
        assert specdraft.is_checked()
    finally:
        specdraft.set_checked(previous)
    with pytest.raises(ValueError, match="enabled must be a bool"):
        specdraft.set_checked(1)


# ----------------------------------------------- valid input: the same in both modes


def eagle_paths():
    """(name, call(proposer, batch)) over every way into EagleProposer."""
    rejected = torch.tensor([2, 0, 3, 1], dtype=torch.int32)

    def padded_propose(p, b):
        return p.propose(*b.propose_args(), token_indices_to_sample=b.metadata.query_start_loc[1:] - 1 - rejected,
                         num_rejected_tokens=rejected)  # fmt: skip

    def unpadded(p, b):
        a = b.propose_args()
        return p.propose_unpadded(*a[:4], rejected, b.metadata, num_kept_tokens=18, sampling=a[5])

    def padded(p, b):
        a = b.propose_args()
        return p.propose_padded(a[0], a[1], a[2], *padded_inputs(), b.metadata, a[5],
                                discard_request_mask=torch.tensor([False, True, False, False]))  # fmt: skip

    return [("plain", lambda p, b: p.propose(*b.propose_args())), ("padded", padded_propose),
            ("unpadded", unpadded), ("propose_padded", padded)]  # fmt: skip


@pytest.mark.parametrize(("method", "mrope"), [("eagle", False), ("eagle3", True), ("mtp", False)])
def test_eagle_paths_agree_in_both_modes(method, mrope):
    for name, call in eagle_paths():
        results = []
        for checked in (False, True):
            _, batch, proposer = build(method, "probabilistic", mrope, return_probs="probs")
            with specdraft.checked(checked), torch.no_grad():
                out = call(proposer, batch)
            results.append((out.draft_tokens, out.draft_probs, proposer.kv_caches[0]))
        (t0, p0, c0), (t1, p1, c1) = results
        assert torch.equal(t0, t1) and torch.equal(p0, p1) and torch.equal(c0, c1), name


def test_parallel_drafting_agrees_in_both_modes():
    results = []
    for checked in (False, True):
        _, batch, proposer = build("eagle", parallel_drafting=True, parallel_drafting_token_id=7)
        rejected = torch.tensor([2, 0, 3, 1], dtype=torch.int32)
        with specdraft.checked(checked), torch.no_grad():
            results.append(proposer.propose(*batch.propose_args(), num_rejected_tokens=rejected).draft_tokens)
    assert torch.equal(*results)


@pytest.mark.parametrize("path", ["padded", "unpadded"])
def test_multi_layer_sequence_agrees_in_both_modes(path):
    runs = []
    for checked in (False, True):
        _, proposer = make_multi_layer(False, "probabilistic")
        with specdraft.checked(checked), torch.no_grad():
            runs.append([propose_by_path(proposer, b, r, path).draft_tokens
                         for b, r in multi_layer_calls(False, "probabilistic")])  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_multi_group_sequence_agrees_in_both_modes():
    runs = []
    for checked in (False, True):
        _, proposer = make_multi_group(True, "greedy")
        with specdraft.checked(checked), torch.no_grad():
            runs.append([propose_by_path(proposer, b, r, "padded").draft_tokens
                         for b, r, _ in multi_group_calls(True, "greedy")])  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def autoregressive(advance=True):
    torch.manual_seed(0)
    lm = TinyTargetModel(draft_config(False, num_layers=1)).eval()
    config = SpeculativeConfig(method="eagle", num_speculative_tokens=3, max_model_len=256, block_size=4)
    return AutoregressiveSpeculator(DraftLM(lm), config, lm.allocate_kv_caches(24, 4), advance_draft_positions=advance)


@pytest.mark.parametrize("advance", [True, False])
def test_autoregressive_agrees_in_both_modes(advance):
    _, batch, _ = build()
    rejected = torch.tensor([2, 0, 3, 1], dtype=torch.int32)
    results = []
    for checked in (False, True):
        spec = autoregressive(advance)
        with specdraft.checked(checked), torch.no_grad():
            results.append(spec.propose(*batch.propose_args(), num_rejected_tokens=rejected).draft_tokens)
    assert torch.equal(*results)


# ------------------------------------------ bad values: every proposer refuses them


def test_every_proposer_refuses_bad_values_in_checked_mode():
    _, batch, eagle = build()
    bad_ids = batch.target_token_ids.clone()
    bad_ids[3] = VOCAB
    args = list(batch.propose_args())
    cases = []

    _, _, parallel = build("eagle", parallel_drafting=True, parallel_drafting_token_id=7)
    cases.append(("parallel", lambda: parallel.propose(bad_ids, *args[1:]), r"^target_token_ids\[3\] = 64"))
    spec = autoregressive()
    cases.append(("autoregressive", lambda: spec.propose(bad_ids, *args[1:]), r"^target_token_ids\[3\] = 64"))
    late = with_metadata(batch, slot_mapping=batch.metadata.slot_mapping + 1000).metadata
    cases.append(("autoregressive slots", lambda: spec.propose(*args[:4], late, args[5]), r"^slot_mapping\[0\] = 10"))

    _, multi_layer = make_multi_layer(False, "greedy")
    ml_batch, _ = next(multi_layer_calls(False, "greedy"))
    ml_args = list(ml_batch.propose_args())
    cases.append(("multi-layer", lambda: multi_layer.propose(bad_ids[: ml_args[0].shape[0]], *ml_args[1:]),
                  r"^target_token_ids\[3\] = 64"))  # fmt: skip
    rejected = torch.tensor([5, 0, 0, 0], dtype=torch.int32)
    cases.append(("multi-layer unpadded", lambda: multi_layer.propose_unpadded(*ml_args[:4], rejected,
                  ml_batch.metadata, num_kept_tokens=18), r"^num_rejected_tokens\[0\] = 5"))  # fmt: skip

    _, multi_group = make_multi_group(False, "greedy")
    mg_batch, _, _ = next(multi_group_calls(False, "greedy"))
    md = mg_batch.metadata
    far = [md.slot_mappings[0], md.slot_mappings[1] + 10_000]
    bad_md = with_metadata(mg_batch, slot_mappings=far).metadata
    cases.append(("multi-group", lambda: multi_group.propose(*mg_batch.propose_args()[:4], bad_md),
                  r"^slot_mappings\[1\]\[0\] = 1\d\d\d\d is outside \[0, 168\) \(or -1\)"))  # fmt: skip
    wide = [md.block_tables[0], md.block_tables[1] + 100]
    cases.append(("multi-group table", lambda: multi_group.propose(
        *mg_batch.propose_args()[:4], with_metadata(mg_batch, block_tables=wide).metadata),
        r"^block_tables\[1\]\[0, 0\] = 1\d\d is outside \[0, num_blocks = 21\)"))  # fmt: skip
    cases.append(("eagle", lambda: eagle.propose(bad_ids, *args[1:]), r"^target_token_ids\[3\] = 64"))

    for name, call, match in cases:
        with specdraft.checked(), torch.no_grad(), pytest.raises(ValueError, match=match):
            call()
        assert name


# ------------------------------------------------------------- the compiled path


def test_compiled_path_holds_no_check_and_toggling_never_recompiles():
    """One compile, made with checked mode on: Dynamo folds is_checked() to False
    without reading the flag, so the graph has no check and no host sync, and
    switching the mode off afterwards reuses it. Compiled, a bad value is not
    refused (unchecked semantics), while the same call eagerly in checked mode is."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    _, batch, proposer = build("eagle", "probabilistic")
    compiled = fresh_compile(proposer.propose, backend=capture, fullgraph=True)
    args = batch.propose_args()
    with specdraft.checked(), torch.no_grad(), CompileCounts.measure() as first:
        compiled(*args)
    assert first.compiles == 1 and first.graph_breaks == 0
    (graph,) = graphs
    syncs = {"item", "tolist", "nonzero", "_local_scalar_dense", "masked_select"}
    names = {node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
             for node in graph.graph.nodes}  # fmt: skip
    assert not names & syncs
    for node in graph.graph.nodes:
        trace = node.meta.get("stack_trace") or ""
        assert "value_checks.py" not in trace and "checked_mode.py" not in trace, node

    bad_ids = batch.target_token_ids.clone()
    bad_ids[0] = VOCAB + 5
    with torch.no_grad(), CompileCounts.measure() as again:
        compiled(*args)  # mode off now
        with specdraft.checked():
            out = compiled(bad_ids, *args[1:])  # compiled: no check
    assert again.compiles == 0
    assert bool(((out.draft_tokens >= 0) & (out.draft_tokens < VOCAB)).all())
    with specdraft.checked(), torch.no_grad(), pytest.raises(ValueError, match=r"^target_token_ids\[0\] = 69"):
        proposer.propose(bad_ids, *args[1:])
