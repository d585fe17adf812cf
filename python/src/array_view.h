// One array argument as the binding's checks and swa_decode::DecodeArgs read it, whichever way it
// arrived: imported by nanobind from any DLPack producer (numpy, CuPy, JAX, a capsule), or filled
// in place by the producer's DLPack C exchange API (dlpack_exchange.h: torch tensors without a
// capsule). Shape and strides point into the producer's own metadata, valid while the Python
// argument lives, i.e. for the call.
#pragma once

#include <cstddef>
#include <cstdint>

#include <nanobind/ndarray.h>

namespace swa_decode_py {

struct ArrayView {
  void* data_ptr = nullptr;  // first element (any DLPack byte_offset applied)
  int32_t rank = 0;
  const int64_t* dims = nullptr;      // [rank]
  const int64_t* strides_ = nullptr;  // [rank], in elements
  nanobind::dlpack::dtype dtype_{};
  int32_t device_type_ = 0;  // DLPack device type: 1 = CPU, 2 = CUDA
  int32_t device_id_ = 0;

  // The accessors of nanobind::ndarray, so each check reads the same for both origins.
  size_t ndim() const { return static_cast<size_t>(rank); }
  int64_t shape(size_t i) const { return dims[i]; }
  int64_t stride(size_t i) const { return strides_[i]; }
  nanobind::dlpack::dtype dtype() const { return dtype_; }
  int32_t device_type() const { return device_type_; }
  int32_t device_id() const { return device_id_; }
  void* data() const { return data_ptr; }

  // The array without its leading dimension (the (1, T, W) indices read as (T, W)): the same
  // elements, since only index 0 of that dimension exists.
  ArrayView without_leading_dim() const {
    ArrayView v = *this;
    v.rank = rank - 1;
    v.dims = dims + 1;
    v.strides_ = strides_ + 1;
    return v;
  }
};

// nanobind fills strides for producers that leave them out (compact row-major), so both pointers
// are always set. The pointer is void* as in DLPack: whether an array is written is its
// argument's role (out, lse), not the view's.
template <class Array>
ArrayView view_of(const Array& a) {
  return ArrayView{.data_ptr = const_cast<void*>(static_cast<const void*>(a.data())),
                   .rank = static_cast<int32_t>(a.ndim()),
                   .dims = a.shape_ptr(),
                   .strides_ = a.stride_ptr(),
                   .dtype_ = a.dtype(),
                   .device_type_ = a.device_type(),
                   .device_id_ = a.device_id()};
}

}  // namespace swa_decode_py
