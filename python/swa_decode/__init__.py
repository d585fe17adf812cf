"""swa_decode: sliding-window decode attention over a paged fp8 KV cache (DeepSeek-V4).

- ``decode(q, kv_cache, inv_scale, indices, lens, *, block_size, ..., extra_kv_cache=, ...)``:
  the op (the window and, optionally, the compressed entries in one softmax), on torch tensors
  (CUDA: the GPU kernel on the current stream; CPU: the float64 reference) or on any DLPack array
  (numpy on CPU; CuPy, JAX, ... on CUDA with an explicit ``stream=``).
- ``native_swa_decode_attention(...)``: a drop-in for the seed's function of that name.
- ``torch.ops.swa_decode.decode`` / ``decode_out``: the torch custom ops behind ``decode`` for
  torch tensors (registered when torch is importable), usable under torch.compile and CUDA graphs.
- ``flash_mla``: FlashMLA's ``get_mla_metadata`` / ``flash_mla_with_kvcache`` (sparse decode on
  the engines' 584-byte MODEL1 cache) over ``decode``, for vLLM and SGLang to switch with one import
  (``from swa_decode import flash_mla as flash_mla_interface``); needs torch, imported on use.
- ``limits``: ``GPU_HEAD_DIM``, ``MAX_GPU_HEADS``, ``MAX_WINDOW``, ``MAX_EXTRA_ENTRIES``, the
  library's own numbers.

The semantics (valid entries, sink, LSE, empty tokens) are in docs/semantics.md.
"""

from swa_decode import _C, limits
from swa_decode._api import decode, native_swa_decode_attention

__version__ = _C.version()

__all__ = ["decode", "native_swa_decode_attention", "limits", "__version__"]
