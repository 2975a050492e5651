"""truncation_cut against a plain-Python oracle (specs/truncation.py) on Hypothesis
rows (exact ties, -inf, NaN, constant rows, strided rows, fp32 / bf16 / fp16, every
parameter off / on / combined), the documented rules on hand-made rows, the
interpreted kernel against the torch reference, opcheck, fake shapes, bad inputs,
checked mode's value checker and a fullgraph compile that parameter values never
recompile.

Top-p decisions within 1e-4 (relative) of their boundary are left out of the exact
comparisons: float rounding (fp32 there, fp64 in the oracle) may decide them either
way. Everything else, ties included, is compared exactly."""

import importlib.util
import math

import pytest
import torch
from hypothesis import example, given

from specdraft import checked
from specdraft.ops import truncation_cut
from specdraft.ops.sampling.truncation import truncation_cut_reference
from specdraft.testing import CompileCounts, check_truncation_cut_values, fresh_compile

import specs.truncation as spec
from fixtures.lanes import INTERPRETER
from fixtures.truncation import TruncationBatch, truncation_batches

INF = math.inf
MARGIN = 1e-4  # top-p decisions closer than this to their boundary: either way

# Ties, -inf and NaN at every cut in bf16, strided; the last row is one where min-p's
# coming before top-p shows (test_min_p_applies_before_top_p's reason): 3.0 alone.
EDGE_BATCH = TruncationBatch(
    rows=[[2.0, 1.0, 1.0, 1.0, -INF, 0.0, math.nan, -0.5] * 5] * 3 + [[3.0, 2.5] + [-1.0] * 38],
    temperature=[1.0, 0.5, 2.0, 1.0],
    top_k=[4, 2, 0, 0],
    top_p=[1.0, 0.9, 0.5, 0.5],
    min_p=[0.0, 0.2, 0.05, 0.05],
    dtype="bfloat16",
    pad=6,
)


def rows_of(logits: torch.Tensor) -> list[list[float]]:
    return logits.float().cpu().tolist()


def spec_cuts(batch: TruncationBatch, logits: torch.Tensor) -> list[tuple[float, float]]:
    rows = rows_of(logits)
    return [
        spec.truncation_cut(rows[r], batch.temperature[r], batch.top_k[r], batch.top_p[r], batch.min_p[r])
        for r in range(len(rows))
    ]


def cut_of(row, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, dtype=torch.float32, device="cpu") -> float:
    """One row's cut from the op."""
    logits = torch.tensor([row], dtype=dtype, device=device)
    params = (
        torch.tensor([temperature], device=device),
        torch.tensor([top_k], dtype=torch.int32, device=device),
        torch.tensor([top_p], device=device),
        torch.tensor([min_p], device=device),
    )
    return truncation_cut(logits, *params).item()


# ------------------------------------------------------------------ the spec (proof 2)


@pytest.mark.kernel
@given(batch=truncation_batches())
@example(batch=EDGE_BATCH)
def test_kept_set_matches_plain_python(device, batch):
    logits, *params = batch.tensors(device)
    cut = truncation_cut(logits, *params)
    assert cut.dtype == torch.float32 and cut.shape == (len(batch.rows),)
    rows = rows_of(logits)
    for r, (want_cut, margin) in enumerate(spec_cuts(batch, logits)):
        got = cut[r].item()
        assert got == -INF or got in rows[r], f"row {r}: cut {got} is not a value of the row"
        if margin < MARGIN:
            continue
        assert spec.kept(rows[r], got) == spec.kept(rows[r], want_cut), f"row {r}: cut {got}, want {want_cut}"
        assert got == want_cut, f"row {r}"


# ------------------------------------------------------------ the documented rules


@pytest.mark.kernel
def test_top_k_keeps_ties_with_the_kth(device):
    row = [3.0, 2.0, 2.0, 2.0, 1.0]
    assert cut_of(row, top_k=2, device=device) == 2.0  # 4 kept: the k-th's ties
    assert cut_of(row, top_k=1, device=device) == 3.0
    assert cut_of(row, top_k=4, device=device) == 2.0
    assert cut_of(row, top_k=5, device=device) == -INF  # k >= V: off


@pytest.mark.kernel
def test_top_p_keeps_the_whole_tie_group_at_the_cut(device):
    # mass(1.0) = e / (e + 3) = 0.475 < 0.5: the cut falls in the zeros, all of them
    # are kept (vLLM's sort would keep as many as its order puts first).
    assert cut_of([1.0, 0.0, 0.0, 0.0], top_p=0.5, device=device) == 0.0
    assert cut_of([1.0, 0.0, 0.0, 0.0], top_p=0.4, device=device) == 1.0


@pytest.mark.kernel
def test_min_p_applies_before_top_p(device):
    """vLLM's order: top-p's mass is over what min-p keeps. min-p 0.2 keeps {2.0,
    1.75} (threshold 2 + ln 0.2 = 0.39); over those two, 2.0 alone weighs 0.562 >=
    0.5. Top-p first, over the whole row, would keep both (0.349 < 0.5)."""
    row = [2.0, 1.75] + [0.0] * 8
    assert cut_of(row, top_p=0.5, min_p=0.2, device=device) == 2.0
    assert cut_of(row, top_p=0.5, device=device) == 1.75


@pytest.mark.kernel
def test_min_p_threshold_scales_with_temperature(device):
    # Kept: l >= max + T ln(min_p); ln(0.5) = -0.693.
    row = [0.0, -0.625, -0.75, -1.375, -1.5]
    assert cut_of(row, min_p=0.5, temperature=1.0, device=device) == -0.625
    assert cut_of(row, min_p=0.5, temperature=2.0, device=device) == -1.375
    assert cut_of(row, min_p=1.0, temperature=2.0, device=device) == 0.0  # the max's ties alone
    assert cut_of([1.0, 1.0, 0.5], min_p=1.0, device=device) == 1.0


@pytest.mark.kernel
def test_min_p_is_exact_at_its_threshold(device):
    """top + T ln(min_p) in fp64, rounded up to the next fp32: the logit just below
    the threshold goes, the one at or just above stays."""
    ratio = 0.25
    threshold = torch.tensor(math.log(ratio), dtype=torch.float64)
    above = threshold.float()
    if above.double() < threshold:
        above = torch.nextafter(above, torch.tensor(INF))
    below = torch.nextafter(above, torch.tensor(-INF))
    row = [0.0, above.item(), below.item(), -5.0]
    assert cut_of(row, min_p=ratio, device=device) == above.item()


@pytest.mark.kernel
def test_neg_inf_and_nan_are_never_kept_in_a_truncated_row(device):
    row = [1.0, -INF, math.nan, -INF]
    assert cut_of(row, top_k=3, device=device) == 1.0  # fewer than k candidates: all of them
    assert cut_of(row, top_p=0.999, device=device) == 1.0
    assert cut_of(row, min_p=0.01, device=device) == 1.0
    assert cut_of([math.nan, 0.5, -1.0], top_k=2, device=device) == -1.0


@pytest.mark.kernel
def test_rows_kept_whole(device):
    row = [0.5, -1.0, 2.0]
    for temperature in (0.0, -1.0, math.nan, INF):
        assert cut_of(row, temperature=temperature, top_k=1, top_p=0.5, min_p=0.5, device=device) == -INF
    assert cut_of(row, top_k=0, top_p=1.0, min_p=0.0, device=device) == -INF  # all off
    assert cut_of(row, top_k=-3, top_p=1.5, min_p=-0.5, device=device) == -INF  # off below and above
    for row in ([-INF, -INF], [math.nan, -INF], [math.nan]):
        assert cut_of(row, top_k=1, top_p=0.5, min_p=0.5, device=device) == -INF


@pytest.mark.kernel
def test_out_of_range_parameters(device):
    """What the op does with the values checked mode refuses."""
    row = [1.0, 1.0, 0.0, -1.0]
    assert cut_of(row, top_p=0.0, device=device) == 1.0  # the max's tie group
    assert cut_of(row, top_p=-1.0, device=device) == 1.0
    assert cut_of(row, top_p=math.nan, device=device) == -INF  # off
    assert cut_of(row, min_p=3.0, device=device) == 1.0  # as 1
    assert cut_of(row, min_p=math.nan, device=device) == -INF  # off


@pytest.mark.kernel
def test_infinite_logits(device):
    row = [INF, 3.0, INF, -INF]
    assert cut_of(row, top_p=0.9, device=device) == INF  # +inf tokens weigh 1, the rest 0
    assert cut_of(row, min_p=0.1, device=device) == INF
    assert cut_of(row, top_k=3, device=device) == 3.0


@pytest.mark.kernel
def test_signed_zeros_tie(device):
    assert cut_of([-0.0, 0.0, -1.0], top_k=1, device=device) == 0.0
    assert cut_of([0.0, -0.0, -1.0], top_k=2, device=device) == 0.0


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_extreme_values_of_each_dtype(device, dtype):
    info = torch.finfo(dtype)
    row = [info.max, info.min, info.tiny, -info.tiny, info.tiny / 4, 0.0, info.max]
    if INTERPRETER and dtype == torch.bfloat16:
        # The interpreter converts bf16 subnormals to fp32 wrongly (triton 3.9: 2.94e-39
        # -> 0.0, 1.01e-39 -> 4.41e-39); CUDA's conversion is exact.
        row.remove(info.tiny / 4)
    values = torch.tensor(row, dtype=dtype).float().tolist()
    for k in range(1, len(row)):
        want, _ = spec.truncation_cut(values, 1.0, k, 1.0, 0.0)
        assert cut_of(row, top_k=k, dtype=dtype, device=device) == want, k


@pytest.mark.kernel
def test_rows_spanning_many_blocks(device):
    """A long row with its cut at every rank (each top-k), ties in between."""
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(1, 256, generator=gen) * 4).round(decimals=1)
    values = logits[0].tolist()
    for k in (1, 50, 255):
        assert cut_of(values, top_k=k, device=device) == sorted(values, reverse=True)[k - 1]
    for top_p in (0.99,):
        want, margin = spec.truncation_cut(values, 1.0, 0, top_p, 0.0)
        assert margin > MARGIN and cut_of(values, top_p=top_p, device=device) == want


# ---------------------------------------------------------- interpreter lane only


@pytest.mark.interpreter
@given(batch=truncation_batches(max_vocab=200))
@example(batch=EDGE_BATCH)
def test_interpreted_kernel_equals_reference(batch):
    logits, *params = batch.tensors("cpu")
    got, want = truncation_cut(logits, *params), truncation_cut_reference(logits, *params)
    for r, (_, margin) in enumerate(spec_cuts(batch, logits)):
        if margin >= MARGIN:
            assert got[r].item() == want[r].item(), f"row {r}"


def split_cut_finishes(monkeypatch, maxima_chunk, logits, temperature, top_k, top_p, min_p, finished, **settings):
    """op.split_cut (split.py's and maxima.py's kernels) at small tiles (128-token
    chunks, the GPU's window depth, capacity 256, 8 keys; maxima.py's chunks of
    maxima_chunk, its gather's parts of two chunks; `settings` changes them) in
    float32 and bfloat16: the rows `finished` marks 1 (a list, or a list per dtype)
    done with the oracle's cut, those it marks 0 left to the per-row search, and the
    whole op the oracle's on every row."""
    import specdraft.ops.sampling.truncation.op as launch

    tiles = {"CHUNK": 128, "WINDOW_BINS": 64, "CAPACITY": 256, "RESOLVE_TILE": 64, "KEYS": 8}
    maxima = {"MAXIMA_CHUNK": maxima_chunk, "GATHER_PART": 2 * maxima_chunk}
    for name, value in {**tiles, **maxima, **settings}.items():
        monkeypatch.setattr(launch, name, value)
    for dtype in (torch.float32, torch.bfloat16):
        args = (logits.to(dtype), temperature, top_k, top_p, min_p)
        cut, done = launch.split_cut(*args)
        expected = finished[dtype] if isinstance(finished, dict) else finished
        assert done.tolist() == expected, dtype
        whole = truncation_cut(*args).tolist()
        for r, row in enumerate(rows_of(args[0])):
            want, _ = spec.truncation_cut(row, temperature[r].item(), top_k[r].item(), top_p[r].item(), min_p[r].item())
            if expected[r]:
                assert cut[r].item() == want, (dtype, r)
            assert whole[r] == want, (dtype, r)


@pytest.mark.interpreter
def test_split_path_finishes_typical_rows(monkeypatch):
    """split.py's two reads finish every top-k / top-p row of a typical batch (random
    logits, V = 1,000) with the oracle's cut, and leave rows with top-p and min-p to
    the per-row search (min-p alone is maxima.py's): a split path that finished
    nothing would still give exact cuts through the search, only slower, so this is
    what catches it."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(8, 1000, generator=gen) * 3
    temperature = torch.tensor([1.0, 0.7, 0.5, 1.0, 2.0, 0.7, 1.0, 1.0])
    top_k = torch.tensor([50, 0, 0, 20, 5, 1, 0, 0], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.9, 0.5, 0.9, 1.0, 1.0, 0.9, 1.0])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.05, 0.1])
    # One chunk for maxima.py's path: it takes only k = 1, so the other top-k rows are split.py's.
    split_cut_finishes(monkeypatch, 1024, logits, temperature, top_k, top_p, min_p, finished=[1] * 6 + [0, 1])


@pytest.mark.interpreter
def test_maxima_path_finishes_top_k_rows(monkeypatch):
    """maxima.py's path (k <= the number of chunks: the chunks' maxima bound the k-th
    logit from below) finishes typical top-k rows, with top-p and min-p beside top-k,
    and min-p alone (each part's smallest candidate), with the oracle's cut. min-p
    rows are not split.py's, so a finished min-p row is this path's work; a row whose
    k exceeds the chunks, a row of ties (every token above the bound: more than
    CAPACITY to copy) and a row with min-p and top-p stay for the per-row search,
    which still gives the oracle's cut."""
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(11, 600, generator=gen) * 3  # 75 chunks of 8
    logits[7] = 1.5
    logits[9, :300] = -INF  # min-p alone, the smallest candidate in the second half
    temperature = torch.tensor([1.0, 0.7, 0.5, 1.0, 2.0, 1.0, 1.0, 1.0, 0.7, 2.0, 1.0])
    top_k = torch.tensor([50, 20, 5, 1, 20, 75, 76, 3, 0, 0, 0], dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.9, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.9])
    min_p = torch.tensor([0.05, 0.05, 0.2, 0.05, 0.0, 0.01, 0.01, 0.01, 0.05, 0.01, 0.05])
    finished = [1] * 6 + [0, 0, 1, 1, 0]
    split_cut_finishes(monkeypatch, 8, logits, temperature, top_k, top_p, min_p, finished=finished)


@pytest.mark.interpreter
def test_keyed_counts_finish_bf16_rows_whose_range_overflows_the_copy(monkeypatch):
    """split.py's keyed collect: a bf16 row's range spanning at most KEYS keys is
    counted per key, not copied, so rows of many ties (logits in steps of 0.5: more
    tokens in the range than CAPACITY) finish in bf16 and stay for the search in
    float32 (whose keys are too dense to count), both with the oracle's cut."""
    gen = torch.Generator().manual_seed(7)
    logits = (torch.randn(4, 2000, generator=gen) * 6).round() / 2
    temperature = torch.tensor([1.0, 0.7, 2.0, 1.0])
    top_k = torch.zeros(4, dtype=torch.int32)
    top_p = torch.tensor([0.9, 0.9, 0.5, 0.99])
    finished = {torch.float32: [0, 1, 0, 0], torch.bfloat16: [1, 1, 1, 0]}
    # The per-row search's tiles as on the GPU: the interpreter's would take a minute.
    search = {"BLOCK": 512, "MASS_BLOCK": 256, "BINS": 64, "PIVOTS": 16}
    split_cut_finishes(monkeypatch, 1024, logits, temperature, top_k, top_p, torch.zeros(4), finished,
                       CAPACITY=32, RESOLVE_TILE=32, KEYS=32, **search)  # fmt: skip


# ------------------------------------------------------------ op, compile, inputs


def good_inputs(device="cpu", num_rows=3, vocab=10):
    gen = torch.Generator().manual_seed(0)
    return {
        "logits": torch.randn(num_rows, vocab, generator=gen).to(device),
        "temperature": torch.tensor([1.0, 0.0, 0.7], device=device)[:num_rows],
        "top_k": torch.tensor([3, 0, 5], dtype=torch.int32, device=device)[:num_rows],
        "top_p": torch.tensor([0.9, 1.0, 0.5], device=device)[:num_rows],
        "min_p": torch.tensor([0.0, 0.1, 0.05], device=device)[:num_rows],
    }


def test_opcheck(device):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):  # each key shift
        args = good_inputs(device)
        args["logits"] = args["logits"].to(dtype)
        torch.library.opcheck(torch.ops.specdraft.truncation_cut, tuple(args.values()))
    wide = good_inputs(device, vocab=16)
    wide["logits"] = wide["logits"][:, 3:13]  # strided rows
    torch.library.opcheck(torch.ops.specdraft.truncation_cut, tuple(wide.values()))


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        args = {k: mode.from_tensor(v) for k, v in good_inputs().items()}
        cut = torch.ops.specdraft.truncation_cut(*args.values())
    assert cut.shape == (3,) and cut.dtype == torch.float32


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="records the Triton branch: needs triton")
def test_cuda_scratch_memory_per_row():
    """The CUDA branch's scratch at V = 152k, recorded on the CPU (launches recorded,
    not made): at most 32 KB a row (28.7 KB at 3bfe19d). Two [R, 4096] fp32 copy
    buffers, one per path (38320b3 to 99822b1), made it 44.2 KB, and the 10^6-trial
    lossless tests ran out of an H200's memory at 300k rows with 12 workers."""
    from fixtures.gpu_lowering import ops_modules, recorded_launches

    rows, vocab = 8, 152_064
    logits = torch.zeros(rows, vocab, dtype=torch.bfloat16)
    params = (torch.ones(rows), torch.zeros(rows, dtype=torch.int32), torch.full((rows,), 0.9), torch.zeros(rows))
    allocated = []
    real_empty = torch.empty

    def counted_empty(*args, **kwargs):
        tensor = real_empty(*args, **kwargs)
        allocated.append(tensor.numel() * tensor.element_size())
        return tensor

    with recorded_launches(*ops_modules()) as launches, pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "empty", counted_empty)
        truncation_cut(logits, *params)
    assert launches, "the CUDA branch launched nothing"
    assert sum(allocated) / rows <= 32 * 1024, sum(allocated) / rows


def test_empty_batch(device):
    args = good_inputs(device, num_rows=0)
    assert truncation_cut(*args.values()).shape == (0,)


def test_fullgraph_compile_without_recompiles_when_parameters_change(device):
    def cut_and_keep(logits, temperature, top_k, top_p, min_p):
        cut = truncation_cut(logits, temperature, top_k, top_p, min_p)
        return cut, logits >= cut[:, None]

    compiled = fresh_compile(cut_and_keep, fullgraph=True)
    args = good_inputs(device, vocab=37)
    with CompileCounts.measure() as counts:
        for top_k, top_p, min_p in (([3, 0, 5], [0.9, 1.0, 0.5], [0.0, 0.1, 0.05]),
                                    ([0, 1, 36], [1.0, 0.2, 0.99], [0.5, 0.0, 1.0]),
                                    ([40, -1, 2], [0.5, 0.5, 1.0], [0.0, 0.0, 0.0])):  # fmt: skip
            args["top_k"] = torch.tensor(top_k, dtype=torch.int32, device=device)
            args["top_p"] = torch.tensor(top_p, device=device)
            args["min_p"] = torch.tensor(min_p, device=device)
            eager, got = cut_and_keep(*args.values()), compiled(*args.values())
            assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    assert counts.graph_breaks == 0
    assert counts.compiles == 1


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"logits": torch.randn(3, 10, 1)}, "logits"),
        ({"logits": torch.randint(0, 5, (3, 10))}, "logits"),
        ({"logits": torch.randn(3, 0)}, "logits"),
        ({"logits": torch.randn(10, 3).T}, "logits"),
        ({"temperature": torch.ones(3, dtype=torch.float64)}, "temperature"),
        ({"temperature": torch.ones(4)}, "temperature"),
        ({"top_k": torch.ones(3)}, "top_k"),
        ({"top_k": torch.ones(3, dtype=torch.int16)}, "top_k"),
        ({"top_k": torch.ones(2, dtype=torch.int32)}, "top_k"),
        ({"top_p": torch.ones(3, dtype=torch.bfloat16)}, "top_p"),
        ({"top_p": torch.ones(3, 1)}, "top_p"),
        ({"min_p": torch.zeros(3, dtype=torch.int32)}, "min_p"),
        ({"min_p": torch.zeros(6)[::2]}, "min_p"),
    ],
)
def test_bad_input_names_the_argument(change, argument):
    args = {**good_inputs(), **change}
    with pytest.raises(ValueError, match=argument):
        truncation_cut(*args.values())


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"temperature": [1.0, -0.5, 1.0]}, "temperature"),
        ({"temperature": [1.0, math.inf, 1.0]}, "temperature"),
        ({"top_p": [0.9, 0.0, 1.0]}, "top_p"),
        ({"top_p": [0.9, 1.5, 1.0]}, "top_p"),
        ({"top_p": [math.nan, 0.5, 1.0]}, "top_p"),
        ({"min_p": [0.0, -0.1, 0.0]}, "min_p"),
        ({"min_p": [0.0, 1.01, 0.0]}, "min_p"),
        ({"min_p": [0.0, math.nan, 0.0]}, "min_p"),
    ],
)
def test_checked_mode_refuses_bad_values(change, argument):
    args = good_inputs()
    for name, values in change.items():
        args[name] = torch.tensor(values)
    with checked(), pytest.raises(ValueError, match=argument):
        truncation_cut(*args.values())
    truncation_cut(*args.values())  # unchecked: runs
    with pytest.raises(ValueError, match=argument):
        check_truncation_cut_values(args["temperature"], args["top_p"], args["min_p"])


def test_checked_mode_accepts_the_edges():
    args = good_inputs()
    args["top_p"] = torch.tensor([1.0, 1e-6, 0.5])
    args["min_p"] = torch.tensor([0.0, 1.0, 0.5])
    args["top_k"] = torch.tensor([-1, 0, 1000], dtype=torch.int32)
    with checked():
        truncation_cut(*args.values())
