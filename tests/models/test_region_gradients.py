"""Compiled training through the models' layers gets eager's gradients. The layers'
nested compile regions (models/layers.py) stand aside while autograd records: with
them, torch 2.13's Inductor returned gate / up projection gradients off by ~10% when
one graph calls the MLP region twice. Two SwiGLU layers in a pre-norm residual
stack, eager vs torch.compile(fullgraph=True); and under no_grad the region is what
runs (the compiled forward still equals eager)."""

import torch
from torch import nn

from specdraft.models.layers import RMSNorm, SwiGLU


class TwoMLPLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norms = nn.ModuleList([RMSNorm(32, 1e-6) for _ in range(2)])
        self.mlps = nn.ModuleList([SwiGLU(32, 48) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, loss = x, x.new_zeros(())
        for norm, mlp in zip(self.norms, self.mlps, strict=True):
            h = h + mlp(norm(h))
            loss = loss + h.pow(2).sum()
        return loss


def gradients(model: nn.Module, fn, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    fn(x).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_compiled_gradients_equal_eager():
    torch.manual_seed(0)
    model, x = TwoMLPLayers(), torch.randn(8, 32)
    with torch.no_grad():
        for norm in model.norms:
            norm.weight.uniform_(0.5, 1.5)
    want = gradients(model, model, x)
    compiled = torch.compile(model, fullgraph=True)
    got = gradients(model, compiled, x)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-4 * grad.abs().max().item(), msg=name)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-3)
