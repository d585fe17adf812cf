// Argument checks, done once per call, and the translation of a DecodeArgs into the DecodeParams
// every kernel takes. The rules are those of docs/semantics.md, "Argument rules" and "The extra
// source" (its rules are the window's, its messages name extra.<field>).
#pragma once

#include "swa_decode/limits.h"
#include "swa_decode/swa_decode.h"
#include "src/common/params.h"

namespace swa_decode {

// Checks every shape, stride, dtype, pointer and alignment of `args`; reads no tensor data.
// Returns kInvalidArgument with a message naming the field, the expected and the actual value,
// e.g. "window_size must be in [1, <kMaxWindow>], got 0" (limits from swa_decode/limits.h).
// Whether a kernel runs the shape is not checked here (see src/dispatch/select_kernel.h).
Status validate_args(const DecodeArgs& args);

// Builds the kernel parameter struct from arguments that passed validate_args (not re-checked).
// The stride of a dimension of size 1 (T, H, num_blocks or block_size = 1) becomes 0.
DecodeParams make_params(const DecodeArgs& args);

// Short name of a dtype for messages, e.g. "bf16"; "DType(7)" for a value outside the enum.
std::string dtype_name(DType dtype);

}  // namespace swa_decode
