// Producer warpgroup of the Hopper layer kernel: warp 3 compacts each item's tiles a tile ahead
// and loads the item's q; warps 0-2 gather and dequantize each tile, 64 keys (a subtile) at a
// time, into the two-stage K/V ring. Both row formats (docs/semantics.md, "Row formats").
// One file per role: the compaction warp, the gather shared by both gather designs (and v4's
// warps), the split gather's issuer and dequantizing warps; the pair's barriers beside them.
#pragma once

#include "src/kernels/sm90/sm90_layer_compaction.cuh"
#include "src/kernels/sm90/sm90_layer_gather.cuh"
#include "src/kernels/sm90/sm90_layer_pair.cuh"
#include "src/kernels/sm90/sm90_layer_split_gather.cuh"
