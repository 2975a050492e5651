"""`torch.ops.specdraft.*` resolves after a plain `import specdraft`.

`import specdraft` imports no torch (so `specdraft --help` answers at once), and the
ops register when `specdraft.ops` is imported. A program that holds specdraft ops
(`torch.export.load`, an AOTInductor package, a pickled graph) looks them up as
`torch.ops.specdraft.NAME` in a process that may never import `specdraft.ops`. So
`import specdraft` puts a stand-in at `torch.ops.specdraft` (at once if torch is
loaded, else right after torch loads) whose first attribute lookup imports
`specdraft.ops` and hands over to torch's own namespace."""

import importlib
import importlib.util
import sys

NAMESPACE = "specdraft"


class OpsOnFirstUse:
    """Stands at `torch.ops.specdraft` until its first lookup, which registers the ops."""

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy/pickle/inspect probes: no import for those
            raise AttributeError(name)
        import torch

        if vars(torch.ops).get(NAMESPACE) is self:
            delattr(torch.ops, NAMESPACE)  # torch.ops makes its own namespace on the next lookup
        importlib.import_module("specdraft.ops")
        return getattr(getattr(torch.ops, NAMESPACE), name)


def install() -> None:
    """Put the stand-in at `torch.ops.specdraft` unless the ops are registered already."""
    torch = sys.modules["torch"]
    if "specdraft.ops" in sys.modules:
        return
    setattr(torch.ops, NAMESPACE, OpsOnFirstUse())


class AfterTorchLoads:
    """A meta path finder that runs `install` once `import torch` has finished."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module):
            exec_module(module)
            install()

        spec.loader.exec_module = exec_then_install
        return spec


def install_when_torch_loads() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "ops"):
        install()
    elif not any(isinstance(finder, AfterTorchLoads) for finder in sys.meta_path):
        sys.meta_path.insert(0, AfterTorchLoads())
