// One explicit instantiation per file so the portable kernel's variants build in parallel.
#include "src/kernels/portable/decode_portable.cuh"

namespace swa_decode {
template cudaError_t launch_portable_decode<1>(const DecodeParams&, int, int, cudaStream_t);
template int portable_smem_bytes<1>(int, int);
}  // namespace swa_decode
