// NCCL for tensors in GPU memory. One object per engine, used by the engine thread, on the
// process's one GPU: the engine's stream there, one communicator per process set (created on
// first use, in execution order, so every member creates it at the same response), the
// device fusion buffer (packed by the batched copy kernel of gpu_kernels.h when it loads),
// the NCCL calls, and a completion thread.
//
// Stream protocol: the engine stream waits on an event recorded on the producer's stream at
// enqueue (WaitFor); the collective runs on the engine stream; Complete() records an event
// after it and the completion thread waits for that event on the host before the handle
// completes. So when synchronize() returns, the result is in GPU memory and any stream of
// the consumer may read it.
//
// Errors: an NCCL call that fails, or an asynchronous error reported while waiting, aborts
// the set's communicator (ncclCommAbort, never a process abort); the operations waiting on
// it and every later one on that set fail with NCCL's own message. A member that cannot
// prepare its part (no memory for the fusion buffer or an output, no PreMulSum operator)
// tells the others before anything is launched (Agree), so that no member waits for it.
// A GPU wait longer than the stall shutdown time aborts the communicator too.
//
// Objects: the engine's stream and its copies (DeviceStream, device_stream.h), the
// communicators and the NCCL calls' checks (NcclCommunicators, nccl_communicators.h, which also
// says how they are locked), the completion thread (NcclCompletion, nccl_completion.h); this
// class starts them, makes the reduction operators and launches the collectives.
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/nccl/device_stream.h"
#include "backends/nccl/nccl_communicators.h"
#include "backends/nccl/nccl_completion.h"
#include "common/status.h"
#include "common/types.h"
#include "gpu/gpu_api.h"
#include "operation/process_set.h"

namespace collectives {

// True when NCCL computes this reduction itself (with ncclAvg / ncclRedOpCreatePreMulSum
// for Average and scale factors); otherwise the engine stages it through host memory.
bool NcclCanReduce(DataType dtype, ReduceOp op, double prescale, double postscale);
// Whether NcclBackend::MakeRedOp makes a PreMulSum operator for this reduction (the response
// alone tells).
bool NcclNeedsCustomOp(DataType dtype, ReduceOp op, double prescale, double postscale);

class NcclBackend {
 public:
  ~NcclBackend();

  // Binds the calling (engine) thread to `device`'s primary context, takes the engine stream
  // and starts the completion thread. Once; later calls check that the device is the same.
  // A GPU wait is reported after `warn_s` and aborted after `timeout_s` (0: never).
  Status Start(int device, bool spin, double warn_s = 60.0, double timeout_s = 1800.0);
  bool started() const { return stream_.device() >= 0; }

  // The engine stream's waits and copies, the device fusion buffer and outputs (engine thread).
  DeviceStream& stream() { return stream_; }
  // The communicators: made on first use (collective), agreement, scaling in the copy kernel,
  // abort after a local failure.
  NcclCommunicators& communicators() { return comms_; }
  // Handles complete once the GPU work before them has finished; whether any is pending.
  NcclCompletion& completion() { return completion_; }
  // The set's communicator (collective over its members at the same response: see
  // NcclCommunicators::Get).
  Status Communicator(const ProcessSet& ps, gpu::ncclComm* out);

  // NCCL's reduction operator for a reduction: built in, or a PreMulSum operator carrying the
  // scale factors (and Average's 1/n) made for the set's communicator, which FreeRedOp
  // releases after the launch. NcclNeedsCustomOp tells from the response alone whether one is made.
  struct RedOp {
    int op = 0;
    bool custom = false;
  };
  Status MakeRedOp(int32_t set_id, DataType dtype, ReduceOp op, double prescale, double postscale, int set_size,
                   RedOp* out);
  void FreeRedOp(int32_t set_id, const RedOp& op);

  // Collectives of process set `set_id` on its communicator, on the engine stream. Counts in
  // elements for reductions, in bytes for data movement; one entry per member where per-member.
  Status Allreduce(int32_t set_id, const void* in, void* out, int64_t count, DataType dtype, const RedOp& op);
  // ncclAllReduce calls made so far (any thread): how many NCCL calls a burst of gradients took.
  int64_t allreduce_launches() const { return allreduce_launches_.load(std::memory_order_relaxed); }
  Status ReduceScatter(int32_t set_id, const void* in, void* out, const std::vector<int64_t>& counts, DataType dtype,
                       const RedOp& op, int me);
  Status Broadcast(int32_t set_id, const void* in, void* out, int64_t bytes, int root);
  Status Allgatherv(int32_t set_id, const void* in, void* out, const std::vector<int64_t>& counts,
                    const std::vector<int64_t>& displs, int me);
  Status Alltoallv(int32_t set_id, const void* in, const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs, void* out, const std::vector<int64_t>& recv_counts,
                   const std::vector<int64_t>& recv_displs, int me);

  // The process set was removed: its communicator (and NCCL's buffers for it) is destroyed
  // by the completion thread once the work queued before now has finished.
  void Release(int32_t set_id);

  // Waits (at most `grace_s`) for queued work, then fails what is left with `why`, aborts
  // communicators that are stuck and destroys the others. Idempotent.
  void Shutdown(const Status& why, double grace_s = 10.0);

 private:
  const gpu::NcclApi* nccl_ = nullptr;
  DeviceStream stream_;
  NcclCommunicators comms_;
  NcclCompletion completion_{stream_, comms_};  // declared after what it refers to
  std::atomic<int64_t> allreduce_launches_{0};
};

}  // namespace collectives
