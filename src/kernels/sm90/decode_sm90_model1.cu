// One explicit instantiation per file so the window kernel's variants build in parallel: kModel1
// rows (docs/semantics.md, "Row formats").
#include "src/kernels/sm90/decode_sm90.cuh"

#include "src/kernels/sm90/launch_sm90.h"

namespace swa_decode {
template cudaError_t launch_sm90_decode<true>(const DecodeParams&, int, bool, cudaStream_t);
}  // namespace swa_decode
