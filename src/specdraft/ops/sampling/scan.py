"""What draft and rejection sampling share: the tiles they split a vocabulary row
into and the checks of the per-request sampling arguments. The scan loop itself and
its reductions are ops/common/scan.py's (re-exported here); rejection sampling's
steps are rejection_steps.py's.

Both samplers split each row of V logits across programs (CHUNK_V tokens each, so
that small batches still fill the GPU) and walk a program's tokens BLOCK at a time
with `scan_vocab`; what a block does to the running state is the caller's STEP
function. The per-program partials are combined by a second, tiny pass
(`combine_argmax`, `combine_softmax`), SPLIT_BLOCK partials at a time.
"""

import torch

from specdraft.checks import INDEX_DTYPES, check_tensor_arg

from ..backend import TRITON_INTERPRET

# Re-exported: these lived here before ops/common; kernels import them from there, by name.
from ..common.fastmath import FAST_LOG2 as FAST_LOG2
from ..common.scan import combine_argmax as combine_argmax
from ..common.scan import combine_softmax as combine_softmax
from ..common.scan import lane_argmax_finish as lane_argmax_finish
from ..common.scan import lane_argmax_init as lane_argmax_init
from ..common.scan import lane_argmax_update as lane_argmax_update
from ..common.scan import lane_softmax_finish as lane_softmax_finish
from ..common.scan import lane_softmax_update as lane_softmax_update
from ..common.scan import load_block as load_block
from ..common.scan import scan_vocab as scan_vocab
from ..common.scan import softmax_update as softmax_update
from .rejection_steps import argmax_step as argmax_step
from .rejection_steps import gumbel_step as gumbel_step
from .rejection_steps import lane_softmax_step as lane_softmax_step

if TRITON_INTERPRET:
    # The interpreter emulates every lane of a block in NumPy: small blocks keep
    # its lane fast and make small test vocabularies span several blocks and chunks.
    BLOCK_V, CHUNK_V, DRAFT_BLOCK_V = 16, 64, 16
else:
    BLOCK_V = 2048  # tokens per loop iteration of one program (rejection sampling)
    CHUNK_V = 8192  # tokens per program; a 152k vocab row spreads over 19 programs
    DRAFT_BLOCK_V = 1024  # draft_sample's loop: 8 tokens per thread (benchmarks/README.md, tiles)
SPLIT_BLOCK = 32  # partials combined per iteration of the combining loops
NUM_WARPS = 8
DRAFT_NUM_WARPS = 4
# rejection_sample's tiles (tokens per program, per loop iteration, warps). Large batches want
# long programs on narrow iterations (8 tokens a thread): at V = 152k, B = 256 they
# read at 3.3 TB/s where the small tiles read at 2.2. Small batches want the
# opposite (few programs, each a short serial loop): the large tiles double their
# latency. The switch is taken only where B is a known number (eager, or a static
# compile); under dynamic shapes the op stays on the small tiles instead of adding
# a guard on B (benchmarks/README.md). The interpreter keeps draft_sample's tiny tiles.
RS_TILES_SMALL = (CHUNK_V, BLOCK_V, NUM_WARPS)
RS_TILES_LARGE = (2 * CHUNK_V, DRAFT_BLOCK_V, 4) if not TRITON_INTERPRET else (CHUNK_V, BLOCK_V, 4)
RS_LARGE_FROM = 4 * 1024 * 1024  # B * V from which the large tiles pay


def check_request_params(num_reqs, temperature, seeds, positions, device_of: torch.Tensor | None = None) -> None:
    """temperature fp32 [B]; seeds, positions int32/int64 [B]; all contiguous."""
    check_tensor_arg("temperature", temperature, torch.float32, shape=(num_reqs,), contiguous=True, device_of=device_of)
    check_tensor_arg("seeds", seeds, INDEX_DTYPES, shape=(num_reqs,), contiguous=True, device_of=device_of)
    check_tensor_arg("positions", positions, INDEX_DTYPES, shape=(num_reqs,), contiguous=True, device_of=device_of)
