"""The tiles draft and rejection sampling (and tree verification) split a
vocabulary row into.

Each sampler splits each row of V logits across programs (CHUNK_V tokens each, so
that small batches still fill the GPU) and walks a program's tokens BLOCK at a time
with ops/common/scan.py's `scan_vocab`; what a block does to the running state is
the caller's STEP function. The per-program partials are combined by a second, tiny
pass (`combine_argmax`, `combine_softmax`), SPLIT_BLOCK partials at a time.
"""

from ..backend import TRITON_INTERPRET

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
