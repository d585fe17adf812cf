#include "testing/layer.h"

#include <stdexcept>

#include "swa_decode/limits.h"

namespace swa_decode::testing {

const char* layer_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::kSwa: return "swa";
    case LayerKind::kC4a: return "c4a";
    case LayerKind::kC128a: return "c128a";
  }
  return "?";
}

std::optional<LayerKind> parse_layer(std::string_view name) {
  for (LayerKind kind : {LayerKind::kSwa, LayerKind::kC4a, LayerKind::kC128a}) {
    if (name == layer_name(kind)) return kind;
  }
  return std::nullopt;
}

int64_t default_mean_context(LayerKind kind) {
  switch (kind) {
    case LayerKind::kSwa: return 4096;
    case LayerKind::kC4a: return 32768;
    case LayerKind::kC128a: return 65536;
  }
  return 0;
}

int64_t max_mean_context(LayerKind kind) {
  switch (kind) {
    case LayerKind::kSwa: return 8192;
    case LayerKind::kC4a: return 65536;
    case LayerKind::kC128a: return kMaxExtraEntries * kC128aCompressRatio / 2;
  }
  return 0;
}

int64_t default_top_k(int64_t num_heads) { return num_heads >= 128 ? 1024 : 512; }

namespace {

LayerSpec resolved(LayerSpec spec, int64_t num_heads) {
  if (spec.mean_context == 0) spec.mean_context = default_mean_context(spec.kind);
  if (spec.kind == LayerKind::kC4a && spec.top_k == 0) spec.top_k = default_top_k(num_heads);
  return spec;
}

}  // namespace

std::string layer_problem(const LayerSpec& raw, int64_t num_heads) {
  const LayerSpec spec = resolved(raw, num_heads);
  const std::string name = layer_name(spec.kind);
  if (spec.mean_context < 1 || spec.mean_context > max_mean_context(spec.kind)) {
    return "the mean context of a " + name + " layer must be in [1, " + std::to_string(max_mean_context(spec.kind)) +
           "], got " + std::to_string(spec.mean_context);
  }
  if (spec.kind != LayerKind::kC4a && raw.top_k != 0) {
    return "only a c4a layer picks a top-k of its compressed entries (a " + name + " layer " +
           (spec.kind == LayerKind::kSwa ? "has none" : "takes all of them") + ")";
  }
  if (spec.kind == LayerKind::kC4a && (spec.top_k < 1 || spec.top_k > kMaxExtraEntries)) {
    return "the top-k of a c4a layer must be in [1, " + std::to_string(kMaxExtraEntries) + "], got " +
           std::to_string(spec.top_k);
  }
  return {};
}

BatchOptions layer_options(const LayerSpec& raw, int64_t num_tokens, int64_t num_heads, int64_t window_size,
                           DType index_dtype, uint64_t seed) {
  if (const std::string problem = layer_problem(raw, num_heads); !problem.empty()) {
    throw std::invalid_argument("layer_options: " + problem);
  }
  const LayerSpec spec = resolved(raw, num_heads);
  BatchOptions o;
  o.num_tokens = num_tokens;
  o.num_heads = num_heads;
  o.head_dim = kGpuHeadDim;
  o.window_size = window_size;
  o.max_context = 2 * spec.mean_context;
  o.index_dtype = index_dtype;
  o.lens_dtype = index_dtype;
  o.with_sink = true;  // DeepSeek-V4 has a learned per-head sink
  o.with_lse = true;   // engines merge the result with other attention through the LSE
  o.seed = seed;
  if (spec.kind == LayerKind::kSwa) return o;

  o.window_pool_covers_context = false;
  o.padding_row_fraction = kLayerPaddingRowFraction;
  ExtraOptions x;
  x.index_dtype = index_dtype;
  x.lens_dtype = index_dtype;
  if (spec.kind == LayerKind::kC4a) {
    x.compress_ratio = kC4aCompressRatio;
    x.top_k = spec.top_k;
    x.max_entries = spec.top_k;
    x.block_size = kC4aBlockSize;
  } else {
    x.compress_ratio = kC128aCompressRatio;
    x.top_k = 0;
    x.max_entries = o.max_context / kC128aCompressRatio;  // the longest context's compressed entries
    x.block_size = kC128aBlockSize;
  }
  o.extra = x;
  return o;
}

int64_t expected_extra_entries(const LayerSpec& raw, int64_t num_heads) {
  const LayerSpec spec = resolved(raw, num_heads);
  switch (spec.kind) {
    case LayerKind::kSwa: return 0;
    case LayerKind::kC4a: return spec.top_k;
    case LayerKind::kC128a: return spec.mean_context / kC128aCompressRatio;
  }
  return 0;
}

}  // namespace swa_decode::testing
