"""Checked mode: every value-level check of every public entry point, before anything
is launched. The checks read tensor values on the host (they sync), so they belong to
development, never to the compiled hot path.

    SPECDRAFT_CHECK=1 python serve.py          # the whole process, read at import
    with specdraft.checked():                  # a block of code
        proposer.propose(...)
    specdraft.set_checked(True)                # from here on

Each check raises a ValueError naming the argument, what was expected and what was
found. Shape, dtype and configuration facts are checked in both modes (they cost
nothing); checked mode adds what only the values can tell.

Under torch.compile the value checks are compiled out whatever the mode:
`is_checked()` tests `torch.compiler.is_compiling()` first, which Dynamo folds to
True without reading the mode flag, so a compiled graph holds no check, no sync and
no guard on the flag: toggling the mode never recompiles. Develop eagerly with
checked mode on; compile once the inputs pass.

The flag is process-wide (a module global, not thread-local): `checked()` sets it
for the duration of its block and restores the previous value.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

ENV_VAR = "SPECDRAFT_CHECK"


def read_env() -> bool:
    """SPECDRAFT_CHECK as a switch: unset, "", "0", "false", "no", "off" mean off."""
    return os.environ.get(ENV_VAR, "0").strip().lower() not in ("", "0", "false", "no", "off")


_checked = read_env()


def is_checked() -> bool:
    """True when value checks should run now: checked mode is on and this is not code
    being traced by torch.compile (see the module docstring)."""
    return not torch.compiler.is_compiling() and _checked


def set_checked(enabled: bool) -> bool:
    """Turn checked mode on or off; returns the previous setting."""
    global _checked
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled must be a bool, got {type(enabled).__name__}")
    previous, _checked = _checked, enabled
    return previous


@contextmanager
def checked(enabled: bool = True) -> Iterator[None]:
    """Checked mode on (or off, with enabled=False) inside the block."""
    previous = set_checked(enabled)
    try:
        yield
    finally:
        set_checked(previous)
