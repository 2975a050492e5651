"""models.linear: the reduction form equals a float64 product, and inside a compile
it replaces F.linear exactly where its conditions hold (fp32, a static row count of
at most SMALL_ROWS, a device in REDUCTION_DEVICES). The CUDA graph's structure is
seen on the CPU by adding "cpu" to the devices; eager calls, symbolic row counts and
other dtypes keep F.linear. (tests/models/test_models_compile.py compiles the demo
pair's kinds, EAGLE-3 and the target, with it at 16 rows against eager.)"""

import pytest
import torch
import torch.nn.functional as F

from specdraft.models import linear as linear_module
from specdraft.models.linear import SMALL_ROWS, Linear, linear_as_reduction, takes_reduction_form

from fixtures.traced_calls import traced_calls


@pytest.mark.parametrize(
    ("lead", "features", "out", "bias"),
    [((1,), 256, 768, False), ((3, 5), 17, 9, True), ((SMALL_ROWS,), 768, 256, False), ((2, 1, 4), 512, 3, True)],
)
def test_reduction_equals_a_float64_product(device, lead, features, out, bias):
    g = torch.Generator().manual_seed(features)
    x = torch.randn(*lead, features, generator=g).to(device)
    weight = torch.randn(out, features, generator=g).to(device)
    b = torch.randn(out, generator=g).to(device) if bias else None
    want = x.double() @ weight.double().T + (0 if b is None else b.double())
    got = linear_as_reduction(x, weight, b)
    assert got.shape == (*lead, out) and got.dtype == torch.float32
    # fp32 sums of `features` unit-variance products: rounding grows like their sqrt.
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-6 * features)


@pytest.mark.parametrize(
    ("shape", "dtype", "devices", "dynamic", "reduced"),
    [
        ((SMALL_ROWS, 32), torch.float32, ("cuda", "cpu"), False, True),
        ((2, 3, 32), torch.float32, ("cuda", "cpu"), False, True),  # rows are all leading dims
        ((SMALL_ROWS + 1, 32), torch.float32, ("cuda", "cpu"), False, False),
        ((3, 6, 32), torch.float32, ("cuda", "cpu"), False, False),  # 18 rows
        ((8, 32), torch.float32, ("cuda", "cpu"), True, False),  # a symbolic row count: no guard added
        ((8, 32), torch.float64, ("cuda", "cpu"), False, False),
        ((8, 32), torch.bfloat16, ("cuda", "cpu"), False, False),
        ((8, 32), torch.float32, ("cuda",), False, False),  # the CPU as shipped
    ],
)
def test_the_compiled_graph_takes_the_reduction_form_where_it_should(
    monkeypatch, shape, dtype, devices, dynamic, reduced
):
    monkeypatch.setattr(linear_module, "SMALL_LINEAR_FORM", "reduction")  # opt-in (SPECDRAFT_SMALL_LINEAR)
    monkeypatch.setattr(linear_module, "REDUCTION_DEVICES", devices)
    torch.manual_seed(0)
    layer = Linear(32, 24).to(dtype)
    x = torch.randn(shape, dtype=dtype)
    calls, out = traced_calls(layer, x, dynamic=dynamic)
    assert any("linear" in call for call in calls) is not reduced, calls
    assert any("sum" in call for call in calls) is reduced, calls
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=tolerance, atol=tolerance)


def test_eager_calls_keep_f_linear(monkeypatch):
    """Eagerly the product would be materialised (rows x out x in): never there."""
    monkeypatch.setattr(linear_module, "SMALL_LINEAR_FORM", "reduction")
    monkeypatch.setattr(linear_module, "REDUCTION_DEVICES", ("cuda", "cpu"))
    x, weight = torch.randn(4, 32), torch.randn(24, 32)
    assert not takes_reduction_form(x, weight)


def test_the_default_form_keeps_f_linear_in_a_compile(monkeypatch):
    """As shipped (SPECDRAFT_SMALL_LINEAR unset: blas), a compile on any device keeps
    F.linear."""
    monkeypatch.setattr(linear_module, "SMALL_LINEAR_FORM", "blas")
    monkeypatch.setattr(linear_module, "REDUCTION_DEVICES", ("cuda", "cpu"))
    calls, _ = traced_calls(Linear(32, 24), torch.randn(4, 32))
    assert any("linear" in call for call in calls), calls


def test_linear_keeps_nn_linear_parameters_and_state_dict():
    """Checkpoints load unchanged: the same parameter names and shapes as nn.Linear."""
    ours, theirs = Linear(7, 5, bias=True), torch.nn.Linear(7, 5, bias=True)
    assert isinstance(ours, torch.nn.Linear)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 7)
    torch.testing.assert_close(ours(x), theirs(x))
