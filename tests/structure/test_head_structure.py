"""Each head's math lives in its class (issue 25): no code outside specdraft.models
switches on a head's type, and the training package does not reach into the
proposers. The draft step is composed once (issue 37): embed -> step_input ->
project -> attend -> finish -> step_outputs lives in DraftHead.step (models/heads)
and the decoder layer (models/layers.py); everything else (the serving forward, the
training unroll, the tree drafters, the target) passes its attention in, and no
layer switches on the metadata's type. Read from the source with ast, so a new
switch or composition fails here by name and line."""

import ast
from pathlib import Path

import specdraft

SRC = Path(specdraft.__file__).parent
# DraftHead, the interface, may be checked for: only a switch on the kind is a fault.
HEAD_TYPES = {"EagleHead", "Eagle3Head", "MTPHead", "Eagle3DecoderLayer", "MTPLayer"}


def modules(under: str = ""):
    root = SRC / under
    return sorted(p for p in root.rglob("*.py"))


def head_type_switches(source: str) -> list[str]:
    """`isinstance(x, HeadType)` (or a tuple / union holding one) in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if names & HEAD_TYPES:
                found.append(f"line {node.lineno}: isinstance(..., {sorted(names & HEAD_TYPES)})")
    return found


def imported_modules(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


def test_the_checker_finds_a_switch():
    assert head_type_switches("if isinstance(h, (EagleHead, int)): pass")
    assert head_type_switches("isinstance(h, heads.MTPHead | str)")
    assert not head_type_switches("isinstance(h, torch.nn.Module)")


def test_no_head_type_switch_outside_models():
    offenders = {
        str(path.relative_to(SRC)): found
        for path in modules()
        if "models" not in path.relative_to(SRC).parts
        for found in [head_type_switches(path.read_text())]
        if found
    }
    assert not offenders, offenders


def test_training_does_not_import_proposers():
    offenders = {
        str(path.relative_to(SRC)): sorted(m for m in imported_modules(path.read_text()) if "proposers" in m)
        for path in modules("training")
    }
    assert not {k: v for k, v in offenders.items() if v}


# The pieces only the head and the layer put together.
STEP_PIECES = {"step_input", "step_hidden", "step_outputs", "project", "finish", "attend_and_mlp", "attention_input"}
COMPOSERS = {"models/heads", "models/layers.py"}


def piece_calls(source: str) -> list[str]:
    """`x.piece(...)` calls of the step's inner pieces in `source`."""
    return [
        f"line {node.lineno}: .{node.func.attr}("
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STEP_PIECES
    ]


def metadata_type_switches(source: str) -> list[str]:
    """`isinstance(x, SomethingMetadata)` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if any(name.endswith("Metadata") for name in names):
                found.append(f"line {node.lineno}: isinstance(..., {sorted(names)})")
    return found


def composes(path) -> bool:
    rel = path.relative_to(SRC).as_posix()
    return any(rel == c or rel.startswith(c + "/") for c in COMPOSERS)


def test_the_checker_finds_a_composition():
    assert piece_calls("a, r = head.step_input(layer, e, h, p)\nh = layer.finish(out, r)")
    assert piece_calls("q, k, v = layer.self_attn.project(p, x)")
    assert not piece_calls("h = head.step(ids, p, h, 0, attend)\nh = layer(p, h, attend)")
    assert metadata_type_switches("if isinstance(m, TreeBatchMetadata): pass")
    assert not metadata_type_switches("isinstance(m, list | tuple)")


def test_the_draft_step_is_composed_only_in_the_head_and_the_layer():
    offenders = {
        str(path.relative_to(SRC)): found
        for path in modules()
        if not composes(path)
        for found in [piece_calls(path.read_text())]
        if found
    }
    assert not offenders, offenders


def test_no_layer_switches_on_the_metadata_type():
    found = metadata_type_switches((SRC / "models" / "layers.py").read_text())
    found += [f for path in modules("models/heads") for f in metadata_type_switches(path.read_text())]
    assert not found, found
