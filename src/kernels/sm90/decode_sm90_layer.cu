#include "src/kernels/sm90/decode_sm90_layer_launch.cuh"
#include "src/kernels/sm90/launch_sm90.h"
#include "src/kernels/sm90/sm90_q_map.h"

namespace swa_decode {

cudaError_t launch_sm90_layer_decode(const DecodeParams& params, int persistent_ctas, int key_splits,
                                     bool dependent_launch, cudaStream_t stream) {
  CUtensorMap q_map;
  cudaError_t err = sm90::encode_q_map(params, &q_map);
  if (err != cudaSuccess) return err;
  if (key_splits > 1) return sm90::launch_layer_split(params, q_map, key_splits, dependent_launch, stream);
  // sm90_record.cpp keeps num_tokens * slabs within int32. A pair's two CTAs take items 2 t and
  // 2 t + 1 (its cluster ranks) only if the grid is even: an odd SM count leaves one SM idle.
  const int slabs = sm90::layer_slabs(params.num_heads);
  const int items = params.num_tokens * slabs;
  const int most = slabs == 2 ? persistent_ctas & ~1 : persistent_ctas;
  const int ctas = items < most ? items : most;
  if (slabs == 1) return sm90::launch_layer_kernel<1, true, false>(params, q_map, ctas, 1, dependent_launch, stream);
  return sm90::mixed_row_formats(params)
             ? sm90::launch_layer_kernel<2, false, false>(params, q_map, ctas, 1, dependent_launch, stream)
             : sm90::launch_layer_kernel<2, true, false>(params, q_map, ctas, 1, dependent_launch, stream);
}

}  // namespace swa_decode
