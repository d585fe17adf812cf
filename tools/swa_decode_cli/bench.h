// The two paths of `swa-decode bench`. Each prints its table, fills `report` and returns whether
// every check passed. On the GPU a row no kernel family runs (as asked: one family, or decode()'s
// choice) is skipped with a line saying why; errors (CUDA failures, a CPU backend that refuses the
// batch) throw std::runtime_error.
#pragma once

#include "tools/swa_decode_cli/options.h"
#include "tools/swa_decode_cli/report.h"

namespace swa_decode::cli {

bool run_bench_gpu(const BenchOptions& options, BenchReport& report);
bool run_bench_cpu(const BenchOptions& options, BenchReport& report);

inline const char* dtype_label(DType dtype) { return dtype == DType::kInt32 ? "int32" : "int64"; }

}  // namespace swa_decode::cli
