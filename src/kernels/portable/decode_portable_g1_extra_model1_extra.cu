// One explicit instantiation per file so the portable kernel's variants build in parallel:
// one head group, the window in kE4m3 rows, the extra source in kModel1.
#include "src/kernels/portable/decode_portable.cuh"

namespace swa_decode {
template cudaError_t launch_portable_source_variant<1, true, false, true>(const DecodeParams&, int, int, bool, cudaStream_t);
}  // namespace swa_decode
