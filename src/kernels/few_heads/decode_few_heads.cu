#include "src/kernels/few_heads/decode_few_heads.cuh"

namespace swa_decode {

template cudaError_t launch_few_heads_variant<1>(const DecodeParams&, bool, cudaStream_t);
template cudaError_t launch_few_heads_variant<2>(const DecodeParams&, bool, cudaStream_t);

}  // namespace swa_decode
