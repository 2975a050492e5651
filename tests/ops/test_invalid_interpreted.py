"""The Triton kernels themselves on invalid inputs (Triton's interpreter on CPU
tensors, TRITON_INTERPRET=1): every tagged rule of every op runs without an error
and leaves the guard rows around each buffer it writes alone, so no masked store
lands outside its tensor. (Out-of-bounds reads, and stores into the buffers the op
allocates itself, are for the GPU sweep under compute-sanitizer:
scripts/gpu_invalid_sweep.py.)"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.testing import OP_RULES, invalid_op_cases

OP_CASES = [(op, rule) for op, rules in OP_RULES.items() for rule in rules]


@pytest.mark.interpreter
@pytest.mark.parametrize(("op", "rule"), OP_CASES, ids=[f"{op}: {rule}" for op, rule in OP_CASES])
@settings(max_examples=3)
@given(data=st.data())
def test_kernel_stays_inside_its_buffers(op, rule, data):
    case = data.draw(invalid_op_cases(op, rule))
    _, _, intact = case.run("cpu", guard=3)
    assert intact
