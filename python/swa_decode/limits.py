"""The op's limits, defined once in include/swa_decode/limits.h and read from there by the
extension, so that Python code can size buffers and check shapes against the numbers the library
validates with.

- ``GPU_HEAD_DIM``: the head dim the GPU kernels are built for (the CPU backend takes any >= 1).
- ``MAX_GPU_HEADS``: the most query heads per call on the GPU (the CPU backend takes more).
- ``MAX_WINDOW``: the largest ``window_size`` (index columns read per token), on every backend.
- ``MAX_EXTRA_ENTRIES``: the largest ``extra_window`` (extra-source index columns read per token),
  on every backend.
"""

from swa_decode._C import GPU_HEAD_DIM, MAX_EXTRA_ENTRIES, MAX_GPU_HEADS, MAX_WINDOW

__all__ = ["GPU_HEAD_DIM", "MAX_GPU_HEADS", "MAX_WINDOW", "MAX_EXTRA_ENTRIES"]
