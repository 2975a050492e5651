"""specdraft: speculative-decoding proposers that compile under
torch.compile(fullgraph=True). The kernel layer is `specdraft.ops`."""

from specdraft import ops
from specdraft.checked_mode import checked, is_checked, set_checked
from specdraft.layout import PADDING_SLOT_ID, BatchMetadata
from specdraft.proposers.adjust_input import AdjustedInput, ShiftCache, adjust_input

__version__ = "0.1.0"
__all__ = [
    "PADDING_SLOT_ID",
    "AdjustedInput",
    "BatchMetadata",
    "ShiftCache",
    "adjust_input",
    "checked",
    "is_checked",
    "ops",
    "set_checked",
    "__version__",
]
