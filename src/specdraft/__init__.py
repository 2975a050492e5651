"""specdraft: speculative-decoding proposers that compile under
torch.compile(fullgraph=True). The kernel layer is `specdraft.ops`."""

from specdraft import ops

__version__ = "0.1.0"
__all__ = ["ops", "__version__"]
