"""Each head's math lives in its class (issue 25): no code outside specdraft.models
switches on a head's type, and the training package does not reach into the
proposers. Read from the source with ast, so a new switch fails here by name."""

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
