#include "testing/layer.h"

#include <stdexcept>
#include <string>

#include "swa_decode/limits.h"

namespace swa_decode::testing {

namespace {

// Per layer: its name, its default mean context and the largest it takes (layer.h says why).
struct LayerFacts {
  LayerKind kind;
  const char* name;
  int64_t default_mean_context, max_mean_context;
};
constexpr LayerFacts kLayers[] = {
    {LayerKind::kSwa, "swa", 4096, 8192},
    {LayerKind::kC4a, "c4a", 32768, 65536},
    {LayerKind::kC128a, "c128a", 65536, kMaxExtraEntries * kC128aCompressRatio / 2},
};

const LayerFacts& facts(LayerKind kind) {
  for (const LayerFacts& layer : kLayers) {
    if (layer.kind == kind) return layer;
  }
  throw std::invalid_argument("LayerKind(" + std::to_string(static_cast<int>(kind)) + ") is no layer");
}

}  // namespace

const char* layer_name(LayerKind kind) { return facts(kind).name; }

std::optional<LayerKind> parse_layer(std::string_view name) {
  for (const LayerFacts& layer : kLayers) {
    if (name == layer.name) return layer.kind;
  }
  return std::nullopt;
}

const char* format_name(KvFormat format) { return format == KvFormat::kModel1 ? "model1" : "seed"; }

std::optional<KvFormat> parse_format(std::string_view name) {
  if (name == "seed") return KvFormat::kE4m3;
  if (name == "model1") return KvFormat::kModel1;
  return std::nullopt;
}

int64_t default_mean_context(LayerKind kind) { return facts(kind).default_mean_context; }

int64_t max_mean_context(LayerKind kind) { return facts(kind).max_mean_context; }

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
  o.kv_format = spec.format;
  o.block_size = spec.format == KvFormat::kModel1 ? kModel1WindowBlockSize : kSeedWindowBlockSize;
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
  x.format = spec.format;
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
  if (spec.kind == LayerKind::kC4a) return spec.top_k;
  return spec.kind == LayerKind::kC128a ? spec.mean_context / kC128aCompressRatio : 0;
}

}  // namespace swa_decode::testing
