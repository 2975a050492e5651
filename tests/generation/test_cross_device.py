"""The same seed gives the same tokens on CPU and CUDA: one sampled request decoded
alone on the CPU, then on the GPU inside a batch (at another row, beside greedy and
sampled neighbours), plain and speculative, on the shipped fp32 pair. The noise is
the same bit for bit on both devices (a counter hash of seed and position), so only
a logit difference at the level of fp32 rounding could flip a token."""

import pytest
import torch

from specdraft.config import SamplingParams
from specdraft.demo import PROMPTS, build_decoders, encode

pytestmark = pytest.mark.cuda  # compares the CPU with a CUDA device

MAX_NEW = 40
ALONE = (PROMPTS[0], 0.8, 1234)  # prompt, temperature, seed
NEIGHBOURS = [(PROMPTS[1], 0.0, 7), (PROMPTS[2], 1.1, 2**40 + 3)]


def decode_rows(device: str, kind: str, rows) -> list[list[int]]:
    plain, spec = build_decoders(device, 3, len(rows), compile=False)
    decoder = plain if kind == "plain" else spec
    sampling = SamplingParams(
        temperature=torch.tensor([r[1] for r in rows], dtype=torch.float32),
        seeds=torch.tensor([r[2] for r in rows], dtype=torch.int64),
    )
    result = decoder.generate(encode([r[0] for r in rows]), max_new_tokens=MAX_NEW, sampling=sampling)
    return [t.tolist() for t in result.tokens]


@pytest.mark.parametrize("kind", ["plain", "speculative"])
def test_same_seed_same_tokens_on_cpu_and_cuda(kind):
    (on_cpu,) = decode_rows("cpu", kind, [ALONE])
    on_cuda = decode_rows("cuda", kind, [NEIGHBOURS[0], ALONE, NEIGHBOURS[1]])
    assert len(on_cpu) == MAX_NEW
    assert on_cuda[1] == on_cpu
