#include "dlpack_exchange.h"

namespace swa_decode_py {

// dlpack.h 1.3's ABI, declared from the spec rather than included: the package builds without any
// framework's headers. Only the fields used here are typed; the other function pointer keeps its
// slot as void*.
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
struct ManagedTensorVersioned {  // DLManagedTensorVersioned
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;  // DLPACK_FLAG_BITMASK_*
  Tensor dl_tensor;
};
static_assert(sizeof(ManagedTensorVersioned) == 80,
              "DLManagedTensorVersioned is 32 bytes of header and a DLTensor on 64-bit platforms");
// DLPackManagedTensorAllocator reports a failure through this callback, not a Python error.
using SetError = void (*)(void* error_ctx, const char* kind, const char* message);
struct ExchangeApiHeader {
  Version version;
  ExchangeApiHeader* prev_api;
};
}  // namespace dlpack_abi

// Each function returns 0 on success and -1 on failure (dlpack.h's comment on the allocator says it
// returns the tensor or NULL, but its typedef and torch's implementation return int: 0 / -1). The
// spec says only dltensor_from_py_object_no_sync may be NULL; a producer's table may still leave
// others NULL (tvm-ffi's fallback tables do), so each is tested before use.
struct ExchangeApi {
  dlpack_abi::ExchangeApiHeader header;
  // Allocates `prototype`'s shape, dtype and device (its other fields are ignored), compact.
  int (*managed_tensor_allocator)(dlpack_abi::Tensor* prototype,
                                  dlpack_abi::ManagedTensorVersioned** out, void* error_ctx,
                                  dlpack_abi::SetError set_error);
  void* managed_tensor_from_py_object_no_sync;
  // Takes over `tensor` ("the ownership of the tensor is stolen") and returns a new reference; a
  // Python error on failure.
  int (*managed_tensor_to_py_object_no_sync)(dlpack_abi::ManagedTensorVersioned* tensor,
                                             void** out_py_object);
  int (*dltensor_from_py_object_no_sync)(void* py_object, dlpack_abi::Tensor* out);
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

bool exchange_can_allocate(const ExchangeApi* api) {
  return api->managed_tensor_allocator != nullptr &&
         api->managed_tensor_to_py_object_no_sync != nullptr;
}

namespace {

// The allocator's message is not kept: the caller's fallback allocates again through the
// framework's Python API, which raises the framework's own exception with its own message.
void ignore_allocation_error(void* /*error_ctx*/, const char* /*kind*/, const char* /*message*/) {}

}  // namespace

bool exchange_allocate(const ExchangeApi* api, const AllocationRequest& request, PyObject** array,
                       ArrayView* view) {
  if (!exchange_can_allocate(api)) return false;
  // Only dtype, ndim, shape and device are read (dlpack.h); the allocator does not write through
  // shape.
  dlpack_abi::Tensor prototype{.data = nullptr,
                               .device = {request.device_type, request.device_id},
                               .ndim = request.rank,
                               .dtype = request.dtype,
                               .shape = const_cast<int64_t*>(request.dims),
                               .strides = nullptr,
                               .byte_offset = 0};
  dlpack_abi::ManagedTensorVersioned* managed = nullptr;
  if (api->managed_tensor_allocator(&prototype, &managed, nullptr, ignore_allocation_error) != 0 ||
      managed == nullptr) {
    PyErr_Clear();  // the spec reports through SetError; a producer may set a Python error too
    return false;
  }
  // The conversion takes `managed` over; dlpack.h says nothing of a failed one, so it is not
  // deleted here either (a leak at worst, where a double free could crash: torch fails there only
  // if it cannot wrap a tensor it has just made).
  void* object = nullptr;
  if (api->managed_tensor_to_py_object_no_sync(managed, &object) != 0 || object == nullptr) {
    PyErr_Clear();
    return false;
  }
  PyObject* const allocated = static_cast<PyObject*>(object);
  // Read back from the new object, as every argument is: its shape and strides live as long as it.
  if (!exchange_view(api, allocated, view)) {
    Py_DECREF(allocated);
    return false;
  }
  *array = allocated;
  return true;
}

}  // namespace swa_decode_py
