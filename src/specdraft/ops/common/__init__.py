"""What several op families import: the pieces of a kernel that are not one family's
own (as flash-linear-attention's `ops/common`).

- fastmath.py: the SFU's log2 / exp2 / rcp (exact functions in the interpreter);
- scan.py: the streaming of a vocabulary row (the prefetching block loop, per-lane
  argmax and online softmax, the combining of per-program partials), shared by the
  samplers (ops/sampling) and the training-time metrics (ops/vocab_metrics).

Triton jit functions are imported from here by name (`from ..common.scan import
lane_argmax_update`): Inductor re-emits a user Triton kernel with the jit functions
it calls, and a module attribute is not carried along.
"""
