"""`OpCase`, one op call as plain data (the form every strategy of invalid op inputs
draws: invalid.py, invalid_trees.py, invalid_markov.py, invalid_budget.py), and what
those strategies share: how far an invalid value reaches and the rules every
sampler's temperature takes."""

from dataclasses import dataclass
from typing import Any

import torch

from specdraft import ops

FAR = 2**30  # the largest magnitude an invalid int32 value takes here
SENTINELS = {torch.float32: -7.25e30, torch.int32: -0x5A5A5A, torch.int64: -0x5A5A5A5A5A, torch.bool: True}


@dataclass(frozen=True)
class OpCase:
    """One op call as plain data: `tensors` maps argument names to (dtype name, nested
    lists), `scalars` the other arguments; `writes` names the tensor arguments the op
    mutates. rule: the rule broken ("" for a valid case); argument: what checked mode
    names."""

    op: str
    tensors: dict[str, tuple[str, Any]]
    scalars: dict[str, Any]
    rule: str
    argument: str
    writes: tuple[str, ...] = ()

    def build(self, device="cpu") -> dict[str, torch.Tensor]:
        return {name: torch.tensor(v, dtype=getattr(torch, dtype), device=device)
                for name, (dtype, v) in self.tensors.items()}  # fmt: skip

    def run(self, device="cpu", guard: int = 0) -> tuple[Any, dict[str, torch.Tensor], bool]:
        """Call the op; returns (its result, the tensors it was given, whether every
        guard row around the buffers it writes kept its sentinel)."""
        args = self.build(device)
        backings = {}
        for name in self.writes:
            tensor = args[name]
            backing = torch.full((tensor.shape[0] + 2 * guard, *tensor.shape[1:]), SENTINELS[tensor.dtype],
                                 dtype=tensor.dtype, device=device)  # fmt: skip
            backing[guard : guard + tensor.shape[0]] = tensor
            backings[name] = backing
            args[name] = backing.narrow(0, guard, tensor.shape[0])
        result = getattr(ops, self.op)(**args, **self.scalars)
        intact = all(
            bool((b[:guard] == SENTINELS[b.dtype]).all())
            and bool((b[b.shape[0] - guard :] == SENTINELS[b.dtype]).all())
            for b in backings.values()
        )
        return result, args, intact


TEMPERATURE_RULES = ["temperature: negative", "temperature: NaN", "temperature: inf"]
