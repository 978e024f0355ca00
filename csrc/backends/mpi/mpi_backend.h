// Data movement over MPI for host memory. Every call is made by the engine thread on one of
// the engine's private communicators (the whole job's, or a process set's). Element counts are 64-bit: MPI-4 large-count calls carry
// tensors of more than 2^31-1 elements.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/types.h"

namespace collectives {

class MpiBackend {
 public:
  Status Init();  // creates the float16/bfloat16 reduction ops
  void Finalize();

  // Each rank's host (MPI_Get_processor_name), from every rank of `comm`, by rank: for reports
  // that name the hosts of the ranks a call waits on (watchdog.h).
  static Status HostNames(MPI_Comm comm, std::vector<std::string>* hosts);

  // In place when send == recv. op must be SUM, MIN, MAX or PRODUCT.
  Status Allreduce(MPI_Comm comm, const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op);
  // Starts a nonblocking allreduce of `buf` in place (at most INT_MAX elements); MPI_Wait ends it.
  Status StartAllreduce(MPI_Comm comm, void* buf, int count, DataType dtype, ReduceOp op, MPI_Request* request);
  // inout[i] = in[i] op inout[i] in this process (MPI_Reduce_local): the reductions of the
  // shared-memory allreduce, with the same operations (16-bit floats included) as Allreduce.
  Status ReduceLocal(const void* in, void* inout, int64_t count, DataType dtype, ReduceOp op) const;
  // ReduceScatter with equal shares: every rank receives `count` elements (at most INT_MAX).
  Status ReduceScatterBlock(MPI_Comm comm, const void* send, void* recv, int count, DataType dtype, ReduceOp op);
  Status Broadcast(MPI_Comm comm, void* buf, int64_t bytes, int root);
  // counts/displs in bytes, one per rank.
  Status Allgatherv(MPI_Comm comm, const void* send, int64_t send_bytes, void* recv, const std::vector<int64_t>& counts,
                    const std::vector<int64_t>& displs);
  Status Alltoallv(MPI_Comm comm, const void* send, const std::vector<int64_t>& send_counts, const std::vector<int64_t>& send_displs,
                   void* recv, const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs);
  // recv_counts in elements, one per rank.
  Status ReduceScatter(MPI_Comm comm, const void* send, void* recv, const std::vector<int64_t>& recv_counts, DataType dtype,
                       ReduceOp op);

 private:
  MPI_Datatype MpiType(DataType t) const;
  MPI_Op MpiOp(DataType t, ReduceOp op) const;
  Status Check(int rc, const char* what) const;
  // Completes a nonblocking call that returned `start_rc` (mpi_wait.h's WaitForRequest).
  Status Complete(int start_rc, MPI_Request* request, int64_t bytes, const char* what) const;

  // [0]=sum [1]=min [2]=max [3]=prod, for float16 and bfloat16
  MPI_Op half_ops_[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op bf16_ops_[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

}  // namespace collectives
