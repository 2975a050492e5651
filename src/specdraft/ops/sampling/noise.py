"""The counter-based noise that draft and rejection sampling draw: the hash, its
uniforms, exponentials and Gumbel noise, written twice side by side (Triton and
torch), and the `noise_bits` op that exposes the raw draws.

u is not drawn from a device RNG: it is a pure function of
(seed, position, token index, salt, stream), so the same request samples the same
token on CPU and CUDA, under CUDA-graph replay, and whatever the batch holds. The
function (uint32 arithmetic):

    fmix(x)      = murmur3 finaliser: x ^= x >> 16; x *= 0x85EBCA6B; x ^= x >> 13;
                   x *= 0xC2B2AE35; x ^= x >> 16                 (all mod 2**32)
    absorb(k, w) = fmix((k ^ w) + 0x9E3779B9)
    salt_key     = absorb(absorb(0x243F6A88, salt), stream)     (host, Python ints)
    row_key      = absorb(absorb(absorb(absorb(salt_key, seed_lo), seed_hi), pos_lo), pos_hi)
    bits(token)  = fmix(token * 0x9E3779B9 + row_key)

The 32 bits stand for the uniform U = (bits + 0.5) * 2**-32 in (0, 1). Two fp32
values are built from them, each exact and the same on every device:

    u = ((bits >> 9) + 0.5) * 2**-23       the acceptance tests' uniform (never 0 or 1)
    tail lanes, bits >= 0xFF800000 (U > 1 - 2**-9):
        v = 1 - U = (~bits + 0.5) * 2**-32 (~bits < 2**23: exact in fp32, down to 2**-33)

and the exponential E = -log U (Exp(1)), from which the Gumbel noise is -log E:

    tail lanes:  E = -log1p(-v) = v * (1 + v / 2 + v**2 / 3)   (next term < 2**-29 relative)
    other lanes: E = -log u

Why the tail lanes: a large Gumbel value needs E -> 0, i.e. U -> 1, where u's grid
stops at 1 - 2**-24: -log(-log u) never exceeded 16.6 nats and was coarse below
that, so a token needing more noise than that to win (probability ~e**-17 each,
but 200k such tokens hold 0.6% of the mass) was under-sampled. Taking the
complement exactly puts that end of U on v's fine grid near 0: E goes down to
2**-33, the Gumbel noise up to 33 ln 2 = 22.9 nats, and P(noise > x) follows
1 - exp(-e**-x) to within one 2**-32 atom there (a probability the 32-bit row key
cannot resolve anyway). The series also keeps the SFU's log2, whose error is
absolute (~2**-22), away from E << 1, where it used to swamp E. The other end
(E large, noise below -log(24 ln 2) = -2.8) keeps u's grid: probability < 1e-7.

(The kernels build u and v without an int-to-float conversion: a 23-bit mantissa
of a float in [1, 2), minus 1 - 2**-24, which is exact and the same value.)

23 bits, not 24: ((bits >> 8) + 0.5) * 2**-24 can be 1 - 2**-25, which rounds to
1.0 in fp32 and makes -log u = 0.

seed/position are int64 split into 32-bit words (two's complement). In torch the
uint32 values live in int64 tensors; products are split into 16-bit halves so no
int64 product overflows, which makes both sides bit-identical. `stream` separates
the uses: draft sampling (0), acceptance tests (1) and recovered / bonus tokens (2)
of rejection sampling, so they stay independent at the same position.

The samplers use E in base 2 (E2 = E * log2(e), -log2 u on ordinary lanes):
Gumbel-max keys x * log2(e) / T - log2(E2) (the argmax of x / T + Gumbel noise)
and exponential races over r / E2, with the SFU's log2 / exp2 / rcp on CUDA (FAST)
and exact functions elsewhere (ops/common/fastmath.py). The bits, u and v are bit-identical everywhere; E
and the keys are not (the logs differ by an ulp or so), hence "the same token up to
float near-ties".
Triton functions carry the plain names, their torch twins the suffix `_torch`.
"""

import torch
from torch.library import triton_op, wrap_triton

from specdraft.checks import INDEX_DTYPES, check_int_range, check_tensor_arg

from ..backend import NAMESPACE, TRITON_INTERPRET, cdiv, tl, triton, use_triton

# The SFU functions live in ops/common (vocab_metrics uses them too); exp2 and rcp stay
# importable from here. Imported by name: Inductor re-emits the jit functions a kernel calls.
from ..common.fastmath import exp2 as exp2
from ..common.fastmath import log2
from ..common.fastmath import rcp as rcp

STREAM_DRAFT = 0
STREAM_ACCEPT = 1
STREAM_SAMPLE = 2
SALT_LIMIT = 2**31
LOG2E = 1.4426950408889634
# Tokens per program of the noise_bits kernel (small in the interpreter, which emulates every lane).
NOISE_BLOCK = 16 if TRITON_INTERPRET else 2048

_MASK32 = 0xFFFFFFFF


# ----------------------------------------------------------- the noise, host side


def _fmix32_int(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & _MASK32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def salt_key(salt: int, stream: int) -> int:
    """The per-call part of the row key, folded on the host (a Python int)."""
    key = 0x243F6A88
    for word in (salt & _MASK32, stream & _MASK32):
        key = _fmix32_int(((key ^ word) + 0x9E3779B9) & _MASK32)
    return key


def check_salt(salt: int) -> None:
    check_int_range("salt", salt, 0, SALT_LIMIT - 1)


def check_request_params(num_reqs, temperature, seeds, positions, device_of: torch.Tensor | None = None) -> None:
    """The per-request arguments every sampler takes: temperature fp32 [B] (0 = greedy)
    and the noise's seeds, positions int32/int64 [B]; all contiguous."""
    check_tensor_arg("temperature", temperature, torch.float32, shape=(num_reqs,), contiguous=True, device_of=device_of)
    check_tensor_arg("seeds", seeds, INDEX_DTYPES, shape=(num_reqs,), contiguous=True, device_of=device_of)
    check_tensor_arg("positions", positions, INDEX_DTYPES, shape=(num_reqs,), contiguous=True, device_of=device_of)


# ------------------------------------------------------ the noise, Triton | torch


@triton.jit
def _fmix32(x):
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


def _mul32_torch(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2**32 with x < 2**32: 16-bit halves of c keep products below 2**48.
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _fmix32_eager(x: torch.Tensor) -> torch.Tensor:
    """The finaliser in eager int32 arithmetic: x holds values in [0, 2**32) (int64).
    Products wrap modulo 2**32 in torch's integer kernels (two's complement), so the
    int32 bits are the uint32 bits; right shifts sign-extend, so each is masked to a
    logical shift. Eight int32 passes instead of about twenty int64 ones (the products
    split into 16-bit halves): 2.4x faster on CPU, and the test of the noise against
    the Python hash (tests/ops/sampling/test_noise.py) pins the bits. Eager only: the
    op below is opaque to torch.compile, so no compiler sees the signed overflow."""
    x = x.to(torch.int32)
    x = x ^ ((x >> 16) & 0xFFFF)
    x.mul_(0x85EBCA6B - (1 << 32))
    x = x ^ ((x >> 13) & 0x7FFFF)
    x.mul_(0xC2B2AE35 - (1 << 32))
    x = x ^ ((x >> 16) & 0xFFFF)
    return x.long() & _MASK32


FMIX_CHUNK = 1 << 16  # values per slice: the finaliser's temporaries stay in cache


@torch.library.custom_op(f"{NAMESPACE}::fmix32", mutates_args=())
def _fmix32_op(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1)
    if flat.numel() <= FMIX_CHUNK:
        return _fmix32_eager(flat).view(x.shape)
    out = torch.empty_like(flat)
    for start in range(0, flat.numel(), FMIX_CHUNK):
        out[start : start + FMIX_CHUNK] = _fmix32_eager(flat[start : start + FMIX_CHUNK])
    return out.view(x.shape)


@_fmix32_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _fmix32_torch(x: torch.Tensor) -> torch.Tensor:
    # An opaque op, not inline torch: under torch.compile on CPU, Inductor inlined
    # the finaliser's ~20 integer ops (the products split into 16-bit halves) into
    # every sampling kernel, five times per draw (four for the row key, one per
    # token), and generating that C++ was most of a compile: 75 of 108 s for a
    # probabilistic propose on 2 cores (47 s in all without). As a custom op it is
    # one extern call of eager torch ops, the same bits, run in cache-sized slices.
    return _fmix32_op(x)


@triton.jit
def _absorb(key, word):
    return _fmix32((key ^ word) + 0x9E3779B9)


def _absorb_torch(key: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
    return _fmix32_torch(((key ^ word) + 0x9E3779B9) & _MASK32)


@triton.jit
def row_key(seed, position, SALT_KEY: tl.constexpr):
    seed = seed.to(tl.int64)
    position = position.to(tl.int64)
    key = tl.full([], SALT_KEY, tl.uint32)
    key = _absorb(key, seed.to(tl.uint32))  # truncation: the low word
    key = _absorb(key, (seed >> 32).to(tl.uint32))
    key = _absorb(key, position.to(tl.uint32))
    return _absorb(key, (position >> 32).to(tl.uint32))


def row_key_torch(seeds: torch.Tensor, positions: torch.Tensor, key: int) -> torch.Tensor:
    seeds, positions = seeds.long(), positions.long()
    out = torch.full_like(seeds, key)
    out = _absorb_torch(out, seeds & _MASK32)
    out = _absorb_torch(out, (seeds >> 32) & _MASK32)
    out = _absorb_torch(out, positions & _MASK32)
    return _absorb_torch(out, (positions >> 32) & _MASK32)


@triton.jit
def noise_bits(key, token):
    return _fmix32(token.to(tl.uint32) * 0x9E3779B9 + key)


def noise_bits_torch(key: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    return _fmix32_torch((_mul32_torch(token.long(), 0x9E3779B9) + key) & _MASK32)


@triton.jit
def uniform(bits):
    # 1 + m * 2**-23 from the bits, then - (1 - 2**-24): exactly (m + 0.5) * 2**-23
    # (2m + 1 < 2**24 fits the significand), without an int-to-float conversion.
    one_plus = ((bits >> 9) | 0x3F800000).to(tl.float32, bitcast=True)
    return one_plus - 0.999999940395355224609375


def uniform_torch(bits: torch.Tensor) -> torch.Tensor:
    return ((bits >> 9).to(torch.float32) + 0.5) * 1.1920928955078125e-07


TAIL_BITS = 0xFF800000  # bits >= this: a tail lane (the top 9 bits set)


@triton.jit
def tail_split(bits):
    """(tail lane?, f): f = u on ordinary lanes, f = v * 2**9 on tail lanes, both
    (m + 0.5) * 2**-23 of a 23-bit m (on a tail lane ~bits < 2**23 already)."""
    tail = (bits >> 23) == 511
    mantissa = tl.where(tail, ~bits, bits >> 9)
    return tail, (mantissa | 0x3F800000).to(tl.float32, bitcast=True) - 0.999999940395355224609375


def tail_split_torch(bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tail = bits >= TAIL_BITS
    mantissa = torch.where(tail, bits ^ _MASK32, bits >> 9)
    return tail, (mantissa.to(torch.float32) + 0.5) * 1.1920928955078125e-07


@triton.jit
def tail_series(f):
    """E2 on a tail lane from its f = v * 2**9: v * log2(e) * (1 + v / 2 + v**2 / 3),
    the coefficients log2(e) * 2**-9, log2(e) * 2**-18 / 2 and log2(e) * 2**-27 / 3."""
    return f * (0.0028177637517362566 + f * (2.751722413804938e-06 + f * 3.5829718929751797e-09))


def tail_series_torch(f: torch.Tensor) -> torch.Tensor:
    return f * (0.0028177637517362566 + f * (2.751722413804938e-06 + f * 3.5829718929751797e-09))


@triton.jit
def exponential2(bits, FAST: tl.constexpr):
    """E2 = E / ln 2 (E ~ Exp(1); races compare ratios, so the common factor does
    not change a winner)."""
    tail, f = tail_split(bits)
    return tl.where(tail, tail_series(f), -log2(f, FAST))


def exponential2_torch(bits: torch.Tensor) -> torch.Tensor:
    tail, f = tail_split_torch(bits)
    return torch.where(tail, tail_series_torch(f), -torch.log2(f))


@triton.jit
def log2_exponential2(bits, FAST: tl.constexpr):
    """log2(E2), minus the noise of the base-2 Gumbel-max key
    x * log2(e) / T - log2_exponential2 (-log2(E2) is the Gumbel noise times
    log2(e), plus a constant). One log2 of a selected argument: the tail lanes'
    log2(f) is computed and dropped. |log2 f| rather than -log2 f: the SFU takes the
    absolute value as an operand modifier, a negation would be one more instruction."""
    tail, f = tail_split(bits)
    return log2(tl.where(tail, tail_series(f), tl.abs(log2(f, FAST))), FAST)


def gumbel2_torch(bits: torch.Tensor) -> torch.Tensor:
    return -torch.log2(exponential2_torch(bits))


@triton.jit
def gumbel_keys(x, idx, gain, key, FAST: tl.constexpr):
    """Base-2 Gumbel-max keys of the logits x at tokens idx, gain = gumbel_gain(T):
    x * log2(e) / T - log2(-log2 u), whose argmax samples softmax(x / T). One FFMA
    after the hash and the two logs."""
    return x * gain - log2_exponential2(noise_bits(key, idx), FAST)


@triton.jit
def gumbel_gain(temp):
    """log2(e) / T, the scale of the base-2 keys (1 for greedy rows: plain argmax)."""
    return tl.where(temp <= 0, 1.0, tl.math.div_rn(1.4426950408889634, tl.where(temp <= 0, 1.0, temp)))


def gumbel_gain_torch(temperature: torch.Tensor) -> torch.Tensor:
    greedy = temperature <= 0
    return torch.where(greedy, 1.0, LOG2E / torch.where(greedy, 1.0, temperature.float()))


# ------------------------------------------------------- the noise_bits op (raw draws)


@triton.jit
def _noise_bits_kernel(seeds_ptr, positions_ptr, bits_ptr, vocab, SALT_KEY: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    key = row_key(tl.load(seeds_ptr + row), tl.load(positions_ptr + row), SALT_KEY)
    tl.store(bits_ptr + row * vocab + idx, noise_bits(key, idx).to(tl.int64), mask=idx < vocab)


def noise_bits_reference(seeds, positions, vocab: int, salt: int, stream: int) -> torch.Tensor:
    token = torch.arange(vocab, device=seeds.device)
    return noise_bits_torch(row_key_torch(seeds, positions, salt_key(salt, stream))[:, None], token)


@triton_op(f"{NAMESPACE}::noise_bits", mutates_args=())
def _noise_bits_op(seeds: torch.Tensor, positions: torch.Tensor, vocab: int, salt: int, stream: int) -> torch.Tensor:
    if not use_triton(seeds):
        return noise_bits_reference(seeds, positions, vocab, salt, stream)
    bits = torch.empty((seeds.shape[0], vocab), dtype=torch.int64, device=seeds.device)
    if seeds.shape[0] > 0 and vocab > 0:
        wrap_triton(_noise_bits_kernel)[(seeds.shape[0], cdiv(vocab, NOISE_BLOCK))](
            seeds, positions, bits, vocab, SALT_KEY=salt_key(salt, stream), BLOCK=NOISE_BLOCK
        )
    return bits


def noise_uniform(
    seeds: torch.Tensor, positions: torch.Tensor, vocab: int, *, salt: int = 0, stream: int = STREAM_DRAFT
) -> torch.Tensor:
    """The uniforms u that the samplers draw for (seeds[b], positions[b], token, salt, stream).

    For tests and for users who want to reproduce a draw. The hash runs in Triton on
    CUDA, in torch on CPU.

    Args:
        seeds: [B] int32/int64.
        positions: [B] int32/int64.
        vocab: Python int >= 0, the tokens per row.
        salt: Python int in [0, 2**31 - 1], default 0.
        stream: STREAM_DRAFT (0, default), STREAM_ACCEPT (1) or STREAM_SAMPLE (2).

    Returns:
        u: [B, vocab] fp32, in (0, 1).
    """
    check_tensor_arg("seeds", seeds, INDEX_DTYPES, rank=1)
    check_tensor_arg("positions", positions, INDEX_DTYPES, shape=tuple(seeds.shape), device_of=seeds)
    check_int_range("vocab", vocab, 0)
    check_salt(salt)
    check_int_range("stream", stream, 0, STREAM_SAMPLE)
    return uniform_torch(_noise_bits_op(seeds.contiguous(), positions.contiguous(), vocab, salt, stream))
