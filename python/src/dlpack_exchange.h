// The DLPack C exchange API (dlpack.h 1.3, `DLPackExchangeAPI`): a producer framework exposes, as
// the PyCapsule `type(array).__dlpack_c_exchange_api__` named "dlpack_exchange_api", a table of C
// functions; two of them describe one of its arrays as a DLTensor in place (no capsule, no
// ownership, no stream handshake) and report its current stream for a device. torch >= 2.10
// provides it on torch.Tensor. Going through it costs tens of nanoseconds per array, where
// `Tensor.__dlpack__()` is a Python method of ~2 us per tensor (docs/perf-notes.md, "Eager Python
// call: where the host time goes").
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

}  // namespace swa_decode_py
