#include "dlpack_exchange.h"

namespace swa_decode_py {

// dlpack.h 1.3's ABI, declared from the spec rather than included: the package builds without any
// framework's headers. Only the fields read here are typed; the other function pointers keep their
// slots as void*.
namespace dlpack_abi {
struct Version {
  uint32_t major;
  uint32_t minor;
};
struct Device {
  int32_t device_type;  // DLDeviceType (a C enum, int-sized)
  int32_t device_id;
};
struct Tensor {  // DLTensor
  void* data;
  Device device;
  int32_t ndim;
  nanobind::dlpack::dtype dtype;  // DLDataType {uint8 code, uint8 bits, uint16 lanes}
  int64_t* shape;
  int64_t* strides;  // in elements; NULL means compact row-major (DLPack < 1.2)
  uint64_t byte_offset;
};
static_assert(sizeof(Tensor) == 48, "DLTensor is 48 bytes on 64-bit platforms");
struct ExchangeApiHeader {
  Version version;
  ExchangeApiHeader* prev_api;
};
}  // namespace dlpack_abi

struct ExchangeApi {
  dlpack_abi::ExchangeApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, dlpack_abi::Tensor* out);  // may be NULL
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

namespace {

constexpr const char* kCapsuleName = "dlpack_exchange_api";
constexpr uint32_t kMajorVersion = 1;  // the major version whose layout is declared above
constexpr int32_t kDLCUDA = 2;

// The table as a type offers it: a PyCapsule named "dlpack_exchange_api" in
// __dlpack_c_exchange_api__ (dlpack.h 1.3), or, before that name was settled, its address as an
// int in __c_dlpack_exchange_api__ (the same table: torch's first release of the API).
const ExchangeApi* exchange_api_attribute(PyTypeObject* type) {
  PyObject* const owner = reinterpret_cast<PyObject*>(type);
  const ExchangeApi* api = nullptr;
  if (PyObject* capsule = PyObject_GetAttrString(owner, "__dlpack_c_exchange_api__")) {
    if (PyCapsule_IsValid(capsule, kCapsuleName)) {
      api = static_cast<const ExchangeApi*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    }
    Py_DECREF(capsule);
  }
  PyErr_Clear();
  if (api != nullptr) return api;
  if (PyObject* address = PyObject_GetAttrString(owner, "__c_dlpack_exchange_api__")) {
    if (PyLong_Check(address)) api = static_cast<const ExchangeApi*>(PyLong_AsVoidPtr(address));
    Py_DECREF(address);
  }
  PyErr_Clear();
  // The table is static in the producer ("must stay alive throughout the lifetime of the
  // process", dlpack.h), so it outlives the attribute.
  return api;
}

const ExchangeApi* read_exchange_api(PyTypeObject* type) {
  const ExchangeApi* api = exchange_api_attribute(type);
  if (api == nullptr || api->header.version.major != kMajorVersion ||
      api->dltensor_from_py_object_no_sync == nullptr || api->current_work_stream == nullptr) {
    return nullptr;
  }
  return api;
}

}  // namespace

const ExchangeApi* exchange_api_of(PyObject* array) {
  // The last type asked and its answer. The type is held (a strong reference), so its address
  // cannot be reused by another type while it is cached. Guarded by the GIL.
  static PyTypeObject* cached_type = nullptr;
  static const ExchangeApi* cached_api = nullptr;
  PyTypeObject* type = Py_TYPE(array);
  if (type != cached_type) {
    const ExchangeApi* api = read_exchange_api(type);
    Py_INCREF(type);
    Py_XDECREF(cached_type);
    cached_type = type;
    cached_api = api;
  }
  return cached_api;
}

bool exchange_view(const ExchangeApi* api, PyObject* array, ArrayView* view) {
  dlpack_abi::Tensor t{};
  if (api->dltensor_from_py_object_no_sync(array, &t) != 0) {
    PyErr_Clear();
    return false;
  }
  if (t.strides == nullptr && t.ndim > 0) return false;  // no producer of this API leaves them out
  *view = ArrayView{.data_ptr = static_cast<char*>(t.data) + t.byte_offset,
                    .rank = t.ndim,
                    .dims = t.shape,
                    .strides_ = t.strides,
                    .dtype_ = t.dtype,
                    .device_type_ = t.device.device_type,
                    .device_id_ = t.device.device_id};
  return true;
}

bool exchange_current_stream(const ExchangeApi* api, int32_t device_id, uintptr_t* stream) {
  void* current = nullptr;
  if (api->current_work_stream(kDLCUDA, device_id, &current) != 0) {
    PyErr_Clear();
    return false;
  }
  *stream = reinterpret_cast<uintptr_t>(current);
  return true;
}

}  // namespace swa_decode_py
