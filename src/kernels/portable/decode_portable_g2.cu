// One explicit instantiation per file so the portable kernel's variants build in parallel.
#include "src/kernels/portable/decode_portable.cuh"

namespace swa_decode {
template cudaError_t launch_portable_source_variant<2, false, false, false>(const DecodeParams&, int, int, bool, cudaStream_t);
}  // namespace swa_decode
