// One explicit instantiation per file so the window kernel's variants build in parallel: seed
// (kE4m3) rows.
#include "src/kernels/sm90/decode_sm90.cuh"

#include "src/kernels/sm90/launch_sm90.h"

namespace swa_decode {
template cudaError_t launch_sm90_decode<false>(const DecodeParams&, int, bool, cudaStream_t);
}  // namespace swa_decode
