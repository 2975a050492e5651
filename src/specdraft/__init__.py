"""specdraft: speculative-decoding proposers that compile under
torch.compile(fullgraph=True). The kernel layer is `specdraft.ops`.

The names below load their modules on first use, so `import specdraft` and
`python -m specdraft --help` import no torch (the command line answers --help at
once). `torch.ops.specdraft.*` still resolves after `import specdraft`: the ops
register on the namespace's first lookup (specdraft.op_namespace)."""

import importlib

from specdraft.op_namespace import install_when_torch_loads

__version__ = "0.1.0"

# name -> (module, attribute in it, or None for the module itself)
EXPORTS = {
    "ops": ("specdraft.ops", None),
    "checked": ("specdraft.checked_mode", "checked"),
    "is_checked": ("specdraft.checked_mode", "is_checked"),
    "set_checked": ("specdraft.checked_mode", "set_checked"),
    "PADDING_SLOT_ID": ("specdraft.layout", "PADDING_SLOT_ID"),
    "BatchMetadata": ("specdraft.layout", "BatchMetadata"),
    "AdjustedInput": ("specdraft.proposers.adjust_input", "AdjustedInput"),
    "ShiftCache": ("specdraft.proposers.adjust_input", "ShiftCache"),
    "adjust_input": ("specdraft.proposers.adjust_input", "adjust_input"),
}
__all__ = sorted([*EXPORTS, "__version__"])

install_when_torch_loads()


def __getattr__(name: str):
    if name not in EXPORTS:
        raise AttributeError(f"module 'specdraft' has no attribute {name!r}")
    module_name, attribute = EXPORTS[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *EXPORTS})
