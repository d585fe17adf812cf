// ExchangeViews: the arrays of one call read in place through the DLPack C exchange API
// (dlpack_exchange.h), for the binding's eager torch entry points (decode_exchange,
// flash_mla_exchange).
#pragma once

#include <cstdint>
#include <optional>

#include <Python.h>
#include <nanobind/nanobind.h>

#include "array_view.h"
#include "dlpack_exchange.h"
#include "run_decode.h"

namespace swa_decode_py {

// The arrays of one call through the DLPack C exchange API, read in place: q's, and each other
// argument's when it is an array of q's type (or a subtype) that the API can describe, on q's
// device. Every step says false, having read nothing it cannot vouch for, and the caller then
// takes its general path, which reports what is wrong in its own words.
class ExchangeViews {
 public:
  // q's view; false when q's type has no usable exchange API or q is on neither the CPU nor a
  // CUDA device.
  bool begin(nanobind::handle q, ArrayView* q_view) {
    api_ = swa_decode_py::exchange_api_of(q.ptr());
    if (api_ == nullptr || !swa_decode_py::exchange_view(api_, q.ptr(), q_view)) return false;
    if (q_view->device_type() != kDLCPU && q_view->device_type() != kDLCUDA) return false;
    type_ = Py_TYPE(q.ptr());
    q_ = *q_view;
    return true;
  }
  bool view(nanobind::handle h, ArrayView* v) const {
    return PyObject_TypeCheck(h.ptr(), type_) && swa_decode_py::exchange_view(api_, h.ptr(), v) &&
           v->device_type() == q_.device_type() && v->device_id() == q_.device_id();
  }
  bool view_if_given(nanobind::handle h, std::optional<ArrayView>* v) const {
    if (h.is_none()) return true;
    ArrayView given;
    if (!view(h, &given)) return false;
    *v = given;
    return true;
  }
  // The framework's current stream on q's device (0 for CPU arrays).
  bool stream(uintptr_t* stream) const {
    *stream = 0;
    return q_.device_type() != kDLCUDA ||
           swa_decode_py::exchange_current_stream(api_, q_.device_id(), stream);
  }

 private:
  const swa_decode_py::ExchangeApi* api_ = nullptr;
  PyTypeObject* type_ = nullptr;
  ArrayView q_{};
};

}  // namespace swa_decode_py
