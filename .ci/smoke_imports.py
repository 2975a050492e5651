"""Import every module of the installed specdraft (run by .ci/wheel_smoke.sh in a
venv with torch but neither hypothesis nor triton, from outside the source tree).

Modules are found by walking the installed package, so a new subpackage is covered
without editing this file. The only modules allowed to fail are those in
NEEDS_EXTRA, and they must fail with an ImportError saying what is missing.

Usage: python smoke_imports.py SOURCE_PACKAGE_DIR   (src/specdraft of the tree the
wheel was built from: every module and data file there must be in the wheel).
"""

import importlib
import importlib.util
import pkgutil
import sys
import sysconfig
from pathlib import Path

# Module -> what its ImportError must mention. These modules hold the Hypothesis
# strategies and import hypothesis at the top, so Python's own "No module named
# 'hypothesis'" is their message. (The value checkers live in specdraft.value_checks
# and import without it.)
NEEDS_EXTRA = {
    "specdraft.testing.batch": "hypothesis",
    "specdraft.testing.expand": "hypothesis",
    "specdraft.testing.invalid": "hypothesis",
    "specdraft.testing.invalid_batches": "hypothesis",
    "specdraft.testing.invalid_attention": "hypothesis",
    "specdraft.testing.invalid_budget": "hypothesis",
    "specdraft.testing.invalid_truncation": "hypothesis",
    "specdraft.testing.invalid_markov": "hypothesis",
    "specdraft.testing.invalid_trees": "hypothesis",
    "specdraft.testing.sampling": "hypothesis",
    "specdraft.testing.shift_and_cache": "hypothesis",
}
# Names of specdraft.testing that load one of those modules on first use: the
# error must name the extra to install.
# The hint must install from a wheel as well as a clone: the extra's own requirement.
LAZY_NAMES = {name: 'pip install "hypothesis>=6.100"' for name in ("shift_layouts", "step_layouts")}
# Not installed in the smoke venv: the package must work without them.
ABSENT = ("hypothesis", "triton")


def package_files(package_dir: Path) -> set[str]:
    """Every file of a package folder, relative to it, bytecode and build metadata aside."""
    return {
        str(path.relative_to(package_dir))
        for path in package_dir.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def source_modules(package_dir: Path) -> set[str]:
    names = set()
    for path in package_dir.rglob("*.py"):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def main(source_dir: str) -> int:
    failures = []
    for name in ABSENT:
        if importlib.util.find_spec(name) is not None:
            failures.append(f"{name} is installed in the smoke venv: this check would prove nothing")

    import specdraft

    installed_root = Path(specdraft.__file__).resolve().parent
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    if site not in installed_root.parents:
        failures.append(
            f"specdraft imported from {installed_root}, not from the venv's {site} (editable or on sys.path?)"
        )

    walked, unwalked = {"specdraft"}, []
    # A package that fails to import is still listed (its error is reported below);
    # its submodules cannot be walked, so they are not counted as missing.
    for info in pkgutil.walk_packages(specdraft.__path__, "specdraft.", onerror=unwalked.append):
        walked.add(info.name)
    # Data files too (the demo's assets): package-data globs must match them.
    left_out = package_files(Path(source_dir)) - package_files(installed_root)
    if left_out:
        failures.append(f"files in the source package but not in the wheel: {', '.join(sorted(left_out))}")
    missing = {
        name
        for name in source_modules(Path(source_dir)) - walked
        if not any(name.startswith(package + ".") for package in unwalked)
    }
    if missing:
        failures.append(f"in the source tree but not in the wheel: {', '.join(sorted(missing))}")

    imported = 0
    for name in sorted(walked):
        try:
            importlib.import_module(name)
        except ImportError as error:
            want = NEEDS_EXTRA.get(name)
            if want is None:
                failures.append(f"import {name}: {type(error).__name__}: {error}")
            elif want not in str(error):
                failures.append(f"import {name}: the ImportError does not mention {want!r}: {error}")
            continue
        except Exception as error:  # every failure is reported, then the run fails
            failures.append(f"import {name}: {type(error).__name__}: {error}")
            continue
        if name in NEEDS_EXTRA:
            failures.append(f"{name} imports without its extra: remove it from NEEDS_EXTRA")
        imported += 1
    for name in set(NEEDS_EXTRA) - walked:
        failures.append(f"{name} is listed in NEEDS_EXTRA but is not in the package")

    import specdraft.testing

    for name, want in LAZY_NAMES.items():
        try:
            getattr(specdraft.testing, name)
        except ImportError as error:
            if want not in str(error):
                failures.append(f"specdraft.testing.{name}: the ImportError does not name {want!r}: {error}")
        else:
            failures.append(f"specdraft.testing.{name} loaded without hypothesis installed")

    if failures:
        print("wheel-smoke: FAILED", *failures, sep="\n  ")
        return 1
    print(
        f"wheel-smoke: {imported} modules imported from {installed_root}; {len(NEEDS_EXTRA)} need an extra, as listed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
