// Compile-time check of csrc/gpu/gpu_api.h against the real cuda.h (CHECK_CUDA) and nccl.h
// (CHECK_NCCL), built and run by tests/gpu/test_gpu_api_headers.py wherever the headers are
// installed. The engine declares these itself so that it builds without CUDA; this file
// proves, for every entry point it loads, that
//   - the name it dlsym's is the one the header binds the API to (cuda.h maps some names to
//     _v2 variants with macros), and
//   - the member's function type matches the declaration: same arity, and each result and
//     parameter the same type, or an enum passed as an int of its size, or a pointer to an
//     opaque handle of the same kind, or a struct of the same size passed by value;
// and that every constant and struct size it uses has the header's value.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

// First, so that its handle structs are its own (declared after the headers' global ones, an
// elaborated `struct CUstream_st*` in it would name theirs and prove nothing).
#include "gpu_api.h"

// The headers' opaque handle types (global), whichever of them a header declares.
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
struct CUmod_st;
struct CUfunc_st;
struct ncclComm;

#ifdef CHECK_CUDA
#include <cuda.h>
#endif
#ifdef CHECK_NCCL
#include <nccl.h>
#endif

namespace g = collectives::gpu;

namespace {

// Which handle an opaque struct is (0: none known): a CUstream must not stand for a CUevent.
template <typename T>
struct Handle : std::integral_constant<int, 0> {};
#define CHECK_HANDLE(ours, theirs, tag)                                 \
  template <>                                                           \
  struct Handle<ours> : std::integral_constant<int, tag> {};            \
  template <>                                                           \
  struct Handle<theirs> : std::integral_constant<int, tag> {};
CHECK_HANDLE(g::CUctx_st, ::CUctx_st, 1)
CHECK_HANDLE(g::CUstream_st, ::CUstream_st, 2)
CHECK_HANDLE(g::CUevent_st, ::CUevent_st, 3)
CHECK_HANDLE(g::CUmod_st, ::CUmod_st, 4)
CHECK_HANDLE(g::CUfunc_st, ::CUfunc_st, 5)
CHECK_HANDLE(g::ncclComm_opaque, ::ncclComm, 6)

template <typename T, typename = void>
struct IsComplete : std::false_type {};
template <typename T>
struct IsComplete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

template <typename T>
constexpr bool IsIntLike() {
  return std::is_enum<T>::value || std::is_integral<T>::value;
}

// Whether a value of our type `A` is passed exactly as the header's `B`.
template <typename A, typename B>
constexpr bool Compatible() {
  if constexpr (std::is_same<A, B>::value) {
    return true;
  } else if constexpr (IsIntLike<A>() && IsIntLike<B>()) {
    // An enum of the header declared as an int here (never two different integer types).
    return (std::is_enum<A>::value || std::is_enum<B>::value) && sizeof(A) == sizeof(B);
  } else if constexpr (std::is_pointer<A>::value && std::is_pointer<B>::value) {
    using PA = std::remove_pointer_t<A>;
    using PB = std::remove_pointer_t<B>;
    if constexpr (std::is_const<PA>::value != std::is_const<PB>::value) {
      return false;
    } else if constexpr (std::is_class<PA>::value && std::is_class<PB>::value) {
      // Opaque handles (CUctx_st, ncclComm) are incomplete on both sides and must be the
      // same handle; a struct we declare (ncclUniqueId) must have the header's layout.
      if constexpr (!IsComplete<PA>::value && !IsComplete<PB>::value)
        return Handle<std::remove_cv_t<PA>>::value != 0 &&
               Handle<std::remove_cv_t<PA>>::value == Handle<std::remove_cv_t<PB>>::value;
      else if constexpr (IsComplete<PA>::value && IsComplete<PB>::value)
        return sizeof(PA) == sizeof(PB) && alignof(PA) == alignof(PB);
      else
        return false;
    } else {
      return Compatible<std::remove_cv_t<PA>, std::remove_cv_t<PB>>();
    }
  } else if constexpr (std::is_class<A>::value && std::is_class<B>::value) {
    return sizeof(A) == sizeof(B) && alignof(A) == alignof(B);  // a struct passed by value
  } else {
    return false;
  }
}

template <typename RA, typename... PA, typename RB, typename... PB>
constexpr bool SameFunction(RA (*)(PA...), RB (*)(PB...)) {
  if constexpr (sizeof...(PA) != sizeof...(PB))
    return false;
  else
    return Compatible<RA, RB>() && (Compatible<PA, PB>() && ... && true);
}

constexpr bool StrEq(const char* a, const char* b) { return *a == *b && (*a == '\0' || StrEq(a + 1, b + 1)); }

}  // namespace

#define CHECK_STR_(x) #x
#define CHECK_STR(x) CHECK_STR_(x)
#define CHECK_COUNT(member, symbol, required) +1

#ifdef CHECK_CUDA
// The API name (cu + member) as cuda.h's macros spell it, and our member's type against it.
#define CHECK_CUDA_ENTRY(member, symbol, required)                                                 \
  static_assert(StrEq(CHECK_STR(cu##member), #symbol),                                             \
                "cuda.h binds cu" #member " to another symbol than " #symbol);                     \
  static_assert(SameFunction(static_cast<decltype(g::CudaApi::member)>(nullptr), &::symbol),       \
                "CudaApi::" #member " does not match cuda.h's " #symbol);
COLLECTIVES_CUDA_ENTRY_POINTS(CHECK_CUDA_ENTRY)

static_assert(g::CUDA_SUCCESS == CUDA_SUCCESS, "CUDA_SUCCESS");
static_assert(g::CUDA_ERROR_INVALID_VALUE == CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE");
static_assert(g::CUDA_ERROR_OUT_OF_MEMORY == CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY");
static_assert(g::CUDA_ERROR_INVALID_CONTEXT == CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT");
static_assert(g::CUDA_ERROR_NOT_READY == CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY");
static_assert(g::CU_STREAM_NON_BLOCKING == CU_STREAM_NON_BLOCKING, "CU_STREAM_NON_BLOCKING");
static_assert(g::CU_EVENT_DISABLE_TIMING == CU_EVENT_DISABLE_TIMING, "CU_EVENT_DISABLE_TIMING");
static_assert(g::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "DEVICE_ORDINAL");
static_assert(std::is_same<g::CUdeviceptr, ::CUdeviceptr>::value, "CUdeviceptr");
static_assert(std::is_same<g::CUdevice, ::CUdevice>::value, "CUdevice");
static_assert(sizeof(g::CUresult) == sizeof(::CUresult), "CUresult");
static_assert(sizeof(::CUpointer_attribute) == sizeof(int), "CUpointer_attribute");
#endif

#ifdef CHECK_NCCL
#define CHECK_NCCL_ENTRY(member, symbol, required)                                                 \
  static_assert(StrEq(CHECK_STR(nccl##member), #symbol),                                           \
                "nccl.h binds nccl" #member " to another symbol than " #symbol);                   \
  static_assert(SameFunction(static_cast<decltype(g::NcclApi::member)>(nullptr), &::symbol),       \
                "NcclApi::" #member " does not match nccl.h's " #symbol);
COLLECTIVES_NCCL_ENTRY_POINTS(CHECK_NCCL_ENTRY)

static_assert(g::kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES, "NCCL_UNIQUE_ID_BYTES");
static_assert(sizeof(g::ncclUniqueId) == sizeof(::ncclUniqueId), "ncclUniqueId size");
static_assert(alignof(g::ncclUniqueId) == alignof(::ncclUniqueId), "ncclUniqueId alignment");
static_assert(sizeof(::ncclResult_t) == sizeof(int) && sizeof(::ncclDataType_t) == sizeof(int) &&
                  sizeof(::ncclRedOp_t) == sizeof(int) && sizeof(::ncclScalarResidence_t) == sizeof(int),
              "NCCL enums are int-sized");
#define CHECK_NCCL_VALUE(name) static_assert(static_cast<int>(g::name) == static_cast<int>(::name), #name);
CHECK_NCCL_VALUE(ncclSuccess)
CHECK_NCCL_VALUE(ncclInProgress)
CHECK_NCCL_VALUE(ncclInt8)
CHECK_NCCL_VALUE(ncclUint8)
CHECK_NCCL_VALUE(ncclInt32)
CHECK_NCCL_VALUE(ncclUint32)
CHECK_NCCL_VALUE(ncclInt64)
CHECK_NCCL_VALUE(ncclUint64)
CHECK_NCCL_VALUE(ncclFloat16)
CHECK_NCCL_VALUE(ncclFloat32)
CHECK_NCCL_VALUE(ncclFloat64)
CHECK_NCCL_VALUE(ncclBfloat16)
CHECK_NCCL_VALUE(ncclSum)
CHECK_NCCL_VALUE(ncclProd)
CHECK_NCCL_VALUE(ncclMax)
CHECK_NCCL_VALUE(ncclMin)
CHECK_NCCL_VALUE(ncclAvg)
static_assert(g::ncclScalarHostImmediate == ::ncclScalarHostImmediate, "ncclScalarHostImmediate");
#endif

int main() {
  // What static_assert cannot see: the special stream handles are pointer constants.
#ifdef CHECK_CUDA
  if (reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY) != g::kLegacyStream ||
      reinterpret_cast<uintptr_t>(CU_STREAM_PER_THREAD) != g::kPerThreadStream) {
    std::puts("CU_STREAM_LEGACY / CU_STREAM_PER_THREAD differ from gpu_api.h");
    return 1;
  }
  std::printf("cuda.h %d: %d entry points match\n", CUDA_VERSION, 0 COLLECTIVES_CUDA_ENTRY_POINTS(CHECK_COUNT));
#endif
#ifdef CHECK_NCCL
  std::printf("nccl.h %d.%d.%d: %d entry points match\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
              0 COLLECTIVES_NCCL_ENTRY_POINTS(CHECK_COUNT));
#endif
  return 0;
}
