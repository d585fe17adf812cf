// The DLPack C exchange API (dlpack.h 1.3, `DLPackExchangeAPI`): a producer framework exposes, as
// the PyCapsule `type(array).__dlpack_c_exchange_api__` named "dlpack_exchange_api", a table of C
// functions; two of them describe one of its arrays as a DLTensor in place (no capsule, no
// ownership, no stream handshake) and report its current stream for a device, two more allocate a
// new array and hand it over as one of the producer's Python objects. torch >= 2.10 provides it on
// torch.Tensor. Reading through it costs tens of nanoseconds per array, where `Tensor.__dlpack__()`
// is a Python method of ~2 us per tensor; allocating ~0.8 us on the development CPU (torch makes the
// tensor, then a second one over its DLPack form), where `torch.empty_like(q, memory_format=...)`
// from Python takes ~0.9 us and `q.new_empty(shape, dtype=...)` ~1.9 (docs/perf-notes.md, "Eager
// Python call: where the host time goes").
#pragma once

#include <Python.h>  // first, as the CPython docs ask

#include <cstdint>

#include "array_view.h"

namespace swa_decode_py {

struct ExchangeApi;  // the producer's table, laid out as dlpack.h's DLPackExchangeAPI

// The exchange API of `array`'s type, or nullptr when the type offers none this binding can use
// (none at all, a DLPack major version other than 1, or no in-place DLTensor export). The answer
// is kept for the last type asked, so a call costs one pointer comparison after the first.
const ExchangeApi* exchange_api_of(PyObject* array);

// `array` (an instance of the type `api` came from, or a subtype) described in place. False, with
// no Python error left set, when the producer cannot describe it (a tensor without storage, a dtype
// DLPack has no code for, ...) or leaves out its strides.
bool exchange_view(const ExchangeApi* api, PyObject* array, ArrayView* view);

// The producer's current stream on a CUDA device (torch.cuda.current_stream(device)), as an
// integer cudaStream_t. False, with no Python error left set, when the producer cannot say.
bool exchange_current_stream(const ExchangeApi* api, int32_t device_id, uintptr_t* stream);

// What exchange_allocate makes: a compact row-major (C-contiguous) array of `dtype` with shape
// dims[0..rank) on the DLPack device (device_type, device_id). dims must outlive the call only.
struct AllocationRequest {
  const int64_t* dims;  // [rank]
  int32_t rank;
  nanobind::dlpack::dtype dtype;
  int32_t device_type;  // DLPack device type: 1 = CPU, 2 = CUDA
  int32_t device_id;
};

// A new array made by the producer (torch: at::empty, from the CUDA caching allocator on the current
// stream), as a new reference to one of its Python objects in *array, described in place in *view
// (valid while *array lives). False, with no Python error left set and nothing allocated, when the
// producer offers no allocator, or allocating or handing the array over fails: the caller then
// allocates through the framework's Python API, which raises the framework's own exception (an
// out-of-memory error, say) where the allocation really cannot be made.
bool exchange_allocate(const ExchangeApi* api, const AllocationRequest& request, PyObject** array,
                       ArrayView* view);

// Whether exchange_allocate can work at all with `api` (the producer fills both of its slots).
bool exchange_can_allocate(const ExchangeApi* api);

}  // namespace swa_decode_py
