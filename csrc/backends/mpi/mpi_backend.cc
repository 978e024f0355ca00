#include "backends/mpi/mpi_backend.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "host_math/half_math.h"
#include "host_math/local_reduce.h"
#include "backends/mpi/mpi_wait.h"

#if MPI_VERSION >= 4
#define COLLECTIVES_LARGE_COUNT 1
using MpiCount = MPI_Count;
#else
#define COLLECTIVES_LARGE_COUNT 0
using MpiCount = int64_t;
#endif

namespace collectives {
namespace {

// User-defined reductions for 16-bit floats: widen to float, combine, round back
// (half_math.cc: vector paths where the CPU has them).
template <HalfKind K, HalfOp Op>
void Reduce16(void* in, void* inout, int64_t n) {
  ReduceHalf(K, Op, static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), n);
}

#if COLLECTIVES_LARGE_COUNT
template <HalfKind K, HalfOp Op>
void UserOp(void* in, void* inout, MPI_Count* len, MPI_Datatype*) {
  Reduce16<K, Op>(in, inout, *len);
}
#define COLLECTIVES_OP_CREATE MPI_Op_create_c
#else
template <HalfKind K, HalfOp Op>
void UserOp(void* in, void* inout, int* len, MPI_Datatype*) {
  Reduce16<K, Op>(in, inout, *len);
}
#define COLLECTIVES_OP_CREATE MPI_Op_create
#endif

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t total = 0;
  for (int64_t x : v) total += x;
  return total;
}

}  // namespace

Status MpiBackend::Check(int rc, const char* what) const {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return Status::Error(StatusCode::INTERNAL, std::string(what) + " failed: " + std::string(msg, static_cast<size_t>(len)));
}

// The data calls start a nonblocking collective and complete it under the engine's waiting policy
// (mpi_wait.h), not inside MPICH's blocking wait: that one polls without pause, or, with
// MPIR_CVAR_ENABLE_HEAVY_YIELD=1 (what collectivesrun sets when ranks outnumber cores), calls
// nanosleep(1 ns) between polls, a system call per poll: 6,000 mixed ops on 3 ranks on 2 cores
// spent 6.7 min of system time in 5 min (tests/engine/test_memory.py's soak), nearly all of it there.
Status MpiBackend::Complete(int start_rc, MPI_Request* request, int64_t bytes, const char* what) const {
  if (start_rc != MPI_SUCCESS) return Check(start_rc, what);
  return Check(WaitForRequest(request, bytes), what);
}

Status MpiBackend::Init() {
  int rc = MPI_SUCCESS;
  rc |= COLLECTIVES_OP_CREATE(&UserOp<HalfKind::FLOAT16, HalfOp::SUM>, 1, &half_ops_[0]);
  rc |= COLLECTIVES_OP_CREATE(&UserOp<HalfKind::FLOAT16, HalfOp::MIN>, 1, &half_ops_[1]);
  rc |= COLLECTIVES_OP_CREATE(&UserOp<HalfKind::FLOAT16, HalfOp::MAX>, 1, &half_ops_[2]);
  rc |= COLLECTIVES_OP_CREATE(&UserOp<HalfKind::FLOAT16, HalfOp::PRODUCT>, 1, &half_ops_[3]);
  rc |= COLLECTIVES_OP_CREATE(&UserOp<HalfKind::BFLOAT16, HalfOp::SUM>, 1, &bf16_ops_[0]);
  rc |= COLLECTIVES_OP_CREATE(&UserOp<HalfKind::BFLOAT16, HalfOp::MIN>, 1, &bf16_ops_[1]);
  rc |= COLLECTIVES_OP_CREATE(&UserOp<HalfKind::BFLOAT16, HalfOp::MAX>, 1, &bf16_ops_[2]);
  rc |= COLLECTIVES_OP_CREATE(&UserOp<HalfKind::BFLOAT16, HalfOp::PRODUCT>, 1, &bf16_ops_[3]);
  return Check(rc, "MPI_Op_create");
}

Status MpiBackend::HostNames(MPI_Comm comm, std::vector<std::string>* hosts) {
  int size = 0, len = 0;
  MPI_Comm_size(comm, &size);
  std::vector<char> mine(MPI_MAX_PROCESSOR_NAME, '\0');
  if (MPI_Get_processor_name(mine.data(), &len) != MPI_SUCCESS) mine.assign(mine.size(), '\0');
  std::vector<char> all(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME, '\0');
  if (MPI_Allgather(mine.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                    comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "MPI_Allgather of the ranks' host names failed");
  hosts->clear();
  for (int r = 0; r < size; ++r) {
    const char* name = all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    hosts->emplace_back(name, strnlen(name, MPI_MAX_PROCESSOR_NAME - 1));
  }
  return Status::Ok();
}

void MpiBackend::Finalize() {
  for (MPI_Op* op : {&half_ops_[0], &half_ops_[1], &half_ops_[2], &half_ops_[3], &bf16_ops_[0], &bf16_ops_[1],
                     &bf16_ops_[2], &bf16_ops_[3]}) {
    if (*op != MPI_OP_NULL) MPI_Op_free(op);
  }
}

MPI_Datatype MpiBackend::MpiType(DataType t) const {
  switch (t) {
    case DataType::UINT8: return MPI_UINT8_T;
    case DataType::INT8: return MPI_INT8_T;
    case DataType::INT16: return MPI_INT16_T;
    case DataType::INT32: return MPI_INT32_T;
    case DataType::INT64: return MPI_INT64_T;
    case DataType::FLOAT16: return MPI_UINT16_T;
    case DataType::BFLOAT16: return MPI_UINT16_T;
    case DataType::FLOAT32: return MPI_FLOAT;
    case DataType::FLOAT64: return MPI_DOUBLE;
    case DataType::BOOL: return MPI_UINT8_T;  // 0/1 bytes: Min is logical and, Max logical or
  }
  return MPI_BYTE;
}

MPI_Op MpiBackend::MpiOp(DataType t, ReduceOp op) const {
  int kind = 0;
  switch (op) {
    case ReduceOp::MIN: kind = 1; break;
    case ReduceOp::MAX: kind = 2; break;
    case ReduceOp::PRODUCT: kind = 3; break;
    default: kind = 0; break;  // SUM, and AVERAGE (scaled afterwards)
  }
  if (t == DataType::FLOAT16) return half_ops_[kind];
  if (t == DataType::BFLOAT16) return bf16_ops_[kind];
  static const MPI_Op builtin[4] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
  return builtin[kind];
}

// Large allreduces go in pieces of at most this many bytes. MPICH allocates a temporary
// buffer of about half the message per call; above glibc's largest mmap threshold (32 MiB)
// every such allocation is a fresh mapping, and its page faults doubled the time of a 64 MiB
// allreduce here. 16 MiB pieces keep the temporary buffer reused (benchmarks/allreduce_bench.py
// prints the comparison).
constexpr int64_t kAllreducePieceBytes = 16LL << 20;

Status MpiBackend::Allreduce(MPI_Comm comm, const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return Status::Ok();
  const int64_t esize = DataTypeSize(dtype);
  const int64_t piece = std::max<int64_t>(1, kAllreducePieceBytes / esize);
  for (int64_t off = 0; off < count; off += piece) {
    const int64_t n = std::min(piece, count - off);
    const void* s = send == recv ? MPI_IN_PLACE : static_cast<const char*>(send) + off * esize;
    void* r = static_cast<char*>(recv) + off * esize;
#if COLLECTIVES_LARGE_COUNT
    MPI_Request request = MPI_REQUEST_NULL;
    Status st = Complete(MPI_Iallreduce_c(s, r, n, MpiType(dtype), MpiOp(dtype, op), comm, &request), &request, n * esize, "MPI_Allreduce");
#else
    MPI_Request request = MPI_REQUEST_NULL;
    Status st = Complete(MPI_Iallreduce(s, r, static_cast<int>(n), MpiType(dtype), MpiOp(dtype, op), comm, &request), &request,
                         n * esize, "MPI_Allreduce");
#endif
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status MpiBackend::ReduceLocal(const void* in, void* inout, int64_t count, DataType dtype, ReduceOp op) const {
  if (count == 0) return Status::Ok();
  if (ReduceLocalFast(in, inout, count, dtype, op)) return Status::Ok();  // vector loops (local_reduce.h)
#if COLLECTIVES_LARGE_COUNT
  return Check(MPI_Reduce_local_c(in, inout, count, MpiType(dtype), MpiOp(dtype, op)), "MPI_Reduce_local");
#else
  return Check(MPI_Reduce_local(in, inout, static_cast<int>(count), MpiType(dtype), MpiOp(dtype, op)),
               "MPI_Reduce_local");
#endif
}

Status MpiBackend::StartAllreduce(MPI_Comm comm, void* buf, int count, DataType dtype, ReduceOp op,
                                  MPI_Request* request) {
  return Check(MPI_Iallreduce(MPI_IN_PLACE, buf, count, MpiType(dtype), MpiOp(dtype, op), comm, request),
               "MPI_Iallreduce");
}

Status MpiBackend::ReduceScatterBlock(MPI_Comm comm, const void* send, void* recv, int count, DataType dtype,
                                      ReduceOp op) {
  MPI_Request request = MPI_REQUEST_NULL;
  return Complete(MPI_Ireduce_scatter_block(send, recv, count, MpiType(dtype), MpiOp(dtype, op), comm, &request), &request,
                  static_cast<int64_t>(count) * DataTypeSize(dtype), "MPI_Reduce_scatter_block");
}

Status MpiBackend::Broadcast(MPI_Comm comm, void* buf, int64_t bytes, int root) {
  if (bytes == 0) return Status::Ok();
#if COLLECTIVES_LARGE_COUNT
  MPI_Request request = MPI_REQUEST_NULL;
  return Complete(MPI_Ibcast_c(buf, bytes, MPI_BYTE, root, comm, &request), &request, bytes, "MPI_Bcast");
#else
  for (int64_t off = 0; off < bytes; off += INT_MAX) {
    const int n = static_cast<int>(std::min<int64_t>(INT_MAX, bytes - off));
    MPI_Request request = MPI_REQUEST_NULL;
    Status st = Complete(MPI_Ibcast(static_cast<char*>(buf) + off, n, MPI_BYTE, root, comm, &request), &request, n, "MPI_Bcast");
    if (!st.ok()) return st;
  }
  return Status::Ok();
#endif
}

#if COLLECTIVES_LARGE_COUNT
Status MpiBackend::Allgatherv(MPI_Comm comm, const void* send, int64_t send_bytes, void* recv, const std::vector<int64_t>& counts,
                              const std::vector<int64_t>& displs) {
  std::vector<MPI_Count> c(counts.begin(), counts.end());
  std::vector<MPI_Aint> d(displs.begin(), displs.end());
  MPI_Request request = MPI_REQUEST_NULL;
  return Complete(MPI_Iallgatherv_c(send, send_bytes, MPI_BYTE, recv, c.data(), d.data(), MPI_BYTE, comm, &request), &request,
                  Sum(counts), "MPI_Allgatherv");
}

Status MpiBackend::Alltoallv(MPI_Comm comm, const void* send, const std::vector<int64_t>& sc, const std::vector<int64_t>& sd,
                             void* recv, const std::vector<int64_t>& rc, const std::vector<int64_t>& rd) {
  std::vector<MPI_Count> sc2(sc.begin(), sc.end()), rc2(rc.begin(), rc.end());
  std::vector<MPI_Aint> sd2(sd.begin(), sd.end()), rd2(rd.begin(), rd.end());
  MPI_Request request = MPI_REQUEST_NULL;
  return Complete(MPI_Ialltoallv_c(send, sc2.data(), sd2.data(), MPI_BYTE, recv, rc2.data(), rd2.data(), MPI_BYTE, comm, &request),
                  &request, Sum(sc) + Sum(rc), "MPI_Alltoallv");
}

Status MpiBackend::ReduceScatter(MPI_Comm comm, const void* send, void* recv, const std::vector<int64_t>& counts, DataType dtype,
                                 ReduceOp op) {
  std::vector<MPI_Count> c(counts.begin(), counts.end());
  MPI_Request request = MPI_REQUEST_NULL;
  return Complete(MPI_Ireduce_scatter_c(send, recv, c.data(), MpiType(dtype), MpiOp(dtype, op), comm, &request), &request,
                  Sum(counts) * DataTypeSize(dtype), "MPI_Reduce_scatter");
}
#else
namespace {
bool ToInts(const std::vector<int64_t>& v, std::vector<int>* out) {
  for (int64_t x : v) {
    if (x > INT_MAX) return false;
    out->push_back(static_cast<int>(x));
  }
  return true;
}
Status TooLarge(const char* what) {
  return Status::Error(StatusCode::INVALID_ARGUMENT,
                       std::string(what) + ": counts over 2^31-1 need an MPI-4 library (large-count calls)");
}
}  // namespace

Status MpiBackend::Allgatherv(MPI_Comm comm, const void* send, int64_t send_bytes, void* recv, const std::vector<int64_t>& counts,
                              const std::vector<int64_t>& displs) {
  std::vector<int> c, d;
  if (send_bytes > INT_MAX || !ToInts(counts, &c) || !ToInts(displs, &d)) return TooLarge("allgather");
  MPI_Request request = MPI_REQUEST_NULL;
  return Complete(MPI_Iallgatherv(send, static_cast<int>(send_bytes), MPI_BYTE, recv, c.data(), d.data(), MPI_BYTE, comm, &request),
                  &request, Sum(counts), "MPI_Allgatherv");
}

Status MpiBackend::Alltoallv(MPI_Comm comm, const void* send, const std::vector<int64_t>& sc, const std::vector<int64_t>& sd,
                             void* recv, const std::vector<int64_t>& rc, const std::vector<int64_t>& rd) {
  std::vector<int> a, b, c, d;
  if (!ToInts(sc, &a) || !ToInts(sd, &b) || !ToInts(rc, &c) || !ToInts(rd, &d)) return TooLarge("alltoall");
  MPI_Request request = MPI_REQUEST_NULL;
  return Complete(MPI_Ialltoallv(send, a.data(), b.data(), MPI_BYTE, recv, c.data(), d.data(), MPI_BYTE, comm, &request),
                  &request, Sum(sc) + Sum(rc), "MPI_Alltoallv");
}

Status MpiBackend::ReduceScatter(MPI_Comm comm, const void* send, void* recv, const std::vector<int64_t>& counts, DataType dtype,
                                 ReduceOp op) {
  std::vector<int> c;
  if (!ToInts(counts, &c)) return TooLarge("reducescatter");
  MPI_Request request = MPI_REQUEST_NULL;
  return Complete(MPI_Ireduce_scatter(send, recv, c.data(), MpiType(dtype), MpiOp(dtype, op), comm, &request), &request,
                  Sum(counts) * DataTypeSize(dtype), "MPI_Reduce_scatter");
}
#endif

}  // namespace collectives
