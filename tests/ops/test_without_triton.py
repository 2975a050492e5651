"""The package imports and every op runs its reference when triton is missing."""

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["triton"] = None  # makes `import triton` raise ImportError
import torch
import specdraft.ops as ops
assert not ops.HAS_TRITON
qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
plan = ops.shift_plan(qsl, torch.arange(5) + 4, torch.tensor([1, 3], dtype=torch.int32), torch.tensor([7, 9], dtype=torch.int32),
                      torch.tensor([2, 1], dtype=torch.int32), 2)
src = torch.arange(5, dtype=torch.int64) * 10
dst = torch.zeros_like(src)
cache = torch.tensor([[1, 2], [3, 0]])
ops.shift_and_cache_1d(src, dst, cache, qsl, plan.token_indices_to_sample, plan.shift,
                       torch.tensor([2, 1], dtype=torch.int32))
print(dst.tolist(), cache.tolist())
"""


def test_ops_run_their_reference_without_triton():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    # By hand: both windows shift by 1 (one token after the sample, cache long enough).
    # Window 0 = [cache0[1], src[0], src[1]], window 1 = [cache1[0], src[3]]; the new caches
    # hold the last two rows of each window ending at the moved sample (2 and 4).
    assert out.stdout.split("\n")[0] == "[2, 0, 10, 3, 30] [[0, 10], [3, 30]]"


def test_import_without_triton_is_quiet():
    """Importing every layer without triton prints no "Triton not available" line
    (torch logged one per op definition: 16 at import), and the ops still run."""
    script = 'import sys; sys.modules["triton"] = None\n'
    script += "import specdraft, specdraft.ops, specdraft.models, specdraft.proposers, specdraft.training\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "Triton not available" not in out.stderr, out.stderr
