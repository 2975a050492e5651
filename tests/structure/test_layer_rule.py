"""The layer rule of docs/design.md, checked on the source (with `ast`, importing
nothing):

(a) every module sits on one floor of docs/design.md's drawing (FLOORS, bottom
    first: the bottom layer -> ops -> config / models -> proposers -> generation /
    training / testing -> the command-line modules) and imports only from its own
    floor or below. The package root (`specdraft/__init__.py`, which imports only
    specdraft.op_namespace at load time) may be imported from the config / models floor up; a
    name it loads lazily (`from specdraft import adjust_input`) counts as an import
    of the module that defines it (its EXPORTS table);
(b) no module imports another module's underscore names: `from x import _y` (any x,
    third-party included), or `m._y` on a name bound to an imported specdraft module.

Every import counts, at module level or inside a function. Dunder names
(`__version__`) are not private.
"""

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "specdraft"
BOTTOM = frozenset(
    {"specdraft.layout", "specdraft.checks", "specdraft.checked_mode", "specdraft.value_checks", "specdraft.tree_shape",
     "specdraft.draft_confidence"}
)  # fmt: skip
# docs/design.md's floors, bottom first: a module (or a package and everything in it)
# on floor i imports specdraft modules of floors 0..i only.
FLOORS: tuple[frozenset[str], ...] = (
    BOTTOM,
    # op_namespace: torch.ops.specdraft's stand-in, which loads specdraft.ops on first use
    frozenset({"specdraft.ops", "specdraft.op_namespace"}),
    frozenset({"specdraft.config", "specdraft.models", "specdraft.assets"}),  # assets: the shipped pair's loaders
    frozenset({"specdraft.proposers"}),
    frozenset({"specdraft.generation", "specdraft.training", "specdraft.testing"}),
    frozenset({"specdraft.demo", "specdraft.demo_args", "specdraft.capture", "specdraft.eval", "specdraft.__main__"}),
)
ROOT_FROM_FLOOR = 2  # the package root may be imported from config / models up

# (importing module, import as reported) pairs the rule tolerates for now. Explicit and
# empty: add an entry only with the reason beside it, and remove it with the fix.
ALLOWED: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Violation:
    module: str
    line: int
    rule: str  # "layer" or "private"
    what: str  # the import, as written after resolving relative levels

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.rule}: {self.what}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def resolve_from(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute module of `from <level dots><target> import ...` inside `module`."""
    if level == 0:
        return target or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join([*parts, target] if target else parts)


def within(target: str, allowed: frozenset[str]) -> bool:
    """target is one of `allowed` or inside one; the package root matches only itself."""
    return any(target == a or (a != PACKAGE and target.startswith(a + ".")) for a in allowed)


def floor_of(module: str) -> int | None:
    """The floor `module` sits on; None for the package root or a module on no floor."""
    for i, floor in enumerate(FLOORS):
        if within(module, floor):
            return i
    return None


def allowed_targets(module: str) -> frozenset[str] | None:
    """The specdraft modules `module` may import from (prefix match, the root
    `specdraft` exactly), or None: any (the package root itself)."""
    floor = floor_of(module)
    if floor is None:
        return None
    allowed = frozenset().union(*FLOORS[: floor + 1])
    return allowed | {PACKAGE} if floor >= ROOT_FROM_FLOOR else allowed


def root_exports(root: Path = SRC) -> dict[str, str]:
    """The package root's lazily loaded names -> the module each comes from (its
    EXPORTS table: name -> (module, attribute))."""
    tree = ast.parse((root / PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EXPORTS" for t in node.targets):
            return {name: module for name, (module, _) in ast.literal_eval(node.value).items()}
    return {}


def check_source(
    source: str, module: str, is_package: bool = False, known: frozenset[str] = frozenset(),
    exports: dict[str, str] | None = None,
) -> list:  # fmt: skip
    """Violations of rules (a) and (b) in one module's source. `known`: the specdraft
    modules that exist, so that `from specdraft import layout` means the module;
    `exports`: the root's lazy names (root_exports)."""
    exports = {} if exports is None else exports
    tree = ast.parse(source)
    allowed = allowed_targets(module)
    found: list[Violation] = []
    module_aliases: dict[str, str] = {}  # local name -> imported specdraft module

    def layer(node: ast.AST, target: str, what: str) -> None:
        if allowed is None or not (target == PACKAGE or target.startswith(PACKAGE + ".")):
            return
        if not within(target, allowed):
            found.append(Violation(module, node.lineno, "layer", what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                layer(node, alias.name, f"import {alias.name}")
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    # `import a.b.c` binds a (its attributes walk down to c); `as x` binds c.
                    local = alias.asname or alias.name.split(".")[0]
                    module_aliases[local] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source_module = resolve_from(module, is_package, node.level, node.module)
            for alias in node.names:
                what = f"from {source_module} import {alias.name}"
                submodule = f"{source_module}.{alias.name}"
                target = submodule if submodule in known else source_module
                if source_module == PACKAGE and alias.name in exports:
                    target = exports[alias.name]
                layer(node, target, what)
                if is_private(alias.name):
                    found.append(Violation(module, node.lineno, "private", what))
                if submodule in known:
                    module_aliases[alias.asname or alias.name] = submodule
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and is_private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in module_aliases
        ):
            what = f"{module_aliases[node.value.id]}.{node.attr}"
            found.append(Violation(module, node.lineno, "private", what))
    return found


def source_modules(root: Path = SRC) -> dict[str, tuple[Path, bool]]:
    return {
        module_name(path, root): (path, path.name == "__init__.py") for path in sorted((root / PACKAGE).rglob("*.py"))
    }


def all_violations(root: Path = SRC) -> list[Violation]:
    modules = source_modules(root)
    known = frozenset(modules)
    exports = root_exports(root)
    found = []
    for name, (path, is_package) in modules.items():
        found += check_source(path.read_text(), name, is_package, known, exports)
    return found


# ---------------------------------------------------------------------- the rule


def test_the_source_tree_is_found():
    modules = source_modules()
    assert BOTTOM <= set(modules)
    assert any(name.startswith("specdraft.ops.") for name in modules)


def test_every_module_sits_on_a_floor():
    """A new top-level module or package must be placed on a floor (FLOORS, and
    docs/design.md's drawing), or the rule would not see it."""
    homeless = [name for name in source_modules() if name != PACKAGE and floor_of(name) is None]
    assert not homeless, f"on no floor of FLOORS: {homeless}"


def test_no_module_breaks_the_layer_rule():
    found = [v for v in all_violations() if (v.module, v.what) not in ALLOWED]
    assert not found, "layer rule (docs/design.md) broken:\n" + "\n".join(map(str, found))


def test_the_allow_list_has_no_stale_entries():
    current = {(v.module, v.what) for v in all_violations()}
    assert not (ALLOWED - current), f"fixed, remove from ALLOWED: {sorted(ALLOWED - current)}"


# ----------------------------------------------------- the checker can fail


KNOWN = frozenset({"specdraft", "specdraft.layout", "specdraft.ops", "specdraft.ops.backend", "specdraft.models",
                   "specdraft.models.rope", "specdraft.ops.sampling", "specdraft.ops.sampling.noise", "specdraft.checked_mode",
                   "specdraft.config", "specdraft.proposers", "specdraft.proposers.loop", "specdraft.generation",
                   "specdraft.training", "specdraft.testing", "specdraft.demo"})  # fmt: skip
EXPORTS = {"checked": "specdraft.checked_mode", "adjust_input": "specdraft.proposers.adjust_input"}


@pytest.mark.parametrize(
    ("module", "is_package", "source", "want"),
    [
        # (a) ops reaching up, absolute, relative, inside a function, through the package
        ("specdraft.ops.x", False, "from specdraft.models import rope", "from specdraft.models import rope"),
        ("specdraft.ops.x", False, "from ..models.rope import f", "from specdraft.models.rope import f"),
        ("specdraft.ops.sampling.x", False, "def f():\n    from ...models import rope",
         "from specdraft.models import rope"),
        ("specdraft.ops.x", False, "import specdraft.models.rope", "import specdraft.models.rope"),
        ("specdraft.ops.x", False, "import specdraft", "import specdraft"),
        ("specdraft.ops", True, "from .. import config", "from specdraft import config"),
        # (a) the bottom layer reaching into ops
        ("specdraft.layout", False, "from specdraft.ops import step_metadata", "from specdraft.ops import step_metadata"),
        ("specdraft.checks", False, "from .ops.backend import tl", "from specdraft.ops.backend import tl"),
        # (b) private names, from any module, and attributes of imported specdraft modules
        ("specdraft.models.x", False, "from specdraft.ops.sampling.noise import _fmix32",
         "from specdraft.ops.sampling.noise import _fmix32"),
        ("specdraft.ops.x", False, "from torch._dynamo import _x", "from torch._dynamo import _x"),
        ("specdraft.models.x", False, "import specdraft.ops.sampling.noise as n\nn._fmix32(1)",
         "specdraft.ops.sampling.noise._fmix32"),
        ("specdraft.models.x", False, "from specdraft.ops.sampling import noise\nnoise._absorb", "specdraft.ops.sampling.noise._absorb"),
        # (a) every floor above ops reaching up one floor or more
        ("specdraft.config", False, "from specdraft.proposers import loop", "from specdraft.proposers import loop"),
        ("specdraft.models.x", False, "from ..proposers.loop import f", "from specdraft.proposers.loop import f"),
        ("specdraft.models.x", False, "from specdraft import adjust_input", "from specdraft import adjust_input"),
        ("specdraft.proposers.x", False, "import specdraft.generation", "import specdraft.generation"),
        ("specdraft.proposers.x", False, "def f():\n    from specdraft.training import g", "from specdraft.training import g"),
        ("specdraft.generation.x", False, "from specdraft import demo", "from specdraft import demo"),
        ("specdraft.testing.x", False, "from specdraft.demo import main", "from specdraft.demo import main"),
        ("specdraft.ops.x", False, "from specdraft import adjust_input", "from specdraft import adjust_input"),
    ],
)  # fmt: skip
def test_the_checker_reports_a_violation(module, is_package, source, want):
    found = check_source(source, module, is_package, KNOWN, EXPORTS)
    assert want in [v.what for v in found], found
    assert all(v.module == module for v in found)


@pytest.mark.parametrize(
    ("module", "is_package", "source"),
    [
        ("specdraft.ops.x", False, "from specdraft.layout import PADDING_SLOT_ID\nfrom .backend import tl"),
        ("specdraft.ops.sampling", True, "from .noise import noise_uniform\nfrom ..backend import tl"),
        ("specdraft.ops.x", False, "import torch\nimport triton.language as tl\nfrom torch._dynamo import config"),
        ("specdraft.checks", False, "from specdraft.layout import window_of\nfrom . import checked_mode"),
        ("specdraft.models.x", False, "from specdraft.ops import step_metadata\nfrom specdraft.config import c"),
        ("specdraft.models.x", False, "from __future__ import annotations\nfrom specdraft import __version__"),
        ("specdraft.models.x", False, "import torch\ntorch._dynamo.reset()"),  # not a specdraft module
        ("specdraft.models.x", False, "def _own():\n    pass\n_own()\nself_x = object()._y"),
        # (a) each floor from its own floor and below
        ("specdraft.config", False, "from specdraft.layout import BatchMetadata\nfrom specdraft.models import rope"),
        ("specdraft.proposers.x", False, "from specdraft.config import SpeculativeConfig\nfrom specdraft import checked"),
        ("specdraft.generation.x", False, "from specdraft.proposers import loop\nfrom specdraft.training import t"),
        ("specdraft.testing.x", False, "from specdraft import ops\nfrom specdraft.generation import g"),
        ("specdraft.demo", False, "from specdraft.generation import g\nfrom specdraft.testing import t"),
    ],
)  # fmt: skip
def test_the_checker_passes_what_the_rule_allows(module, is_package, source):
    assert check_source(source, module, is_package, KNOWN, EXPORTS) == []
