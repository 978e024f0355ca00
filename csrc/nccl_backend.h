// NCCL for tensors in GPU memory. One object per engine, used by the engine thread, on the
// process's one GPU: the engine's stream there, one communicator per process set (created on
// first use, in execution order, so every member creates it at the same response), the
// device fusion buffer, the NCCL calls, and a completion thread.
//
// Stream protocol: the engine stream waits on an event recorded on the producer's stream at
// enqueue (WaitFor); the collective runs on the engine stream; Complete() records an event
// after it and the completion thread waits for that event on the host before the handle
// completes. So when synchronize() returns, the result is in GPU memory and any stream of
// the consumer may read it.
//
// Errors: an NCCL call that fails, or an asynchronous error reported while waiting, aborts
// the set's communicator (ncclCommAbort, never a process abort); the operations waiting on
// it and every later one on that set fail with NCCL's own message.
#pragma once
#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu_api.h"
#include "gpu_runtime.h"
#include "process_set.h"
#include "status.h"
#include "types.h"

namespace collectives {

class NcclBackend {
 public:
  using Done = std::function<void(const Status&)>;

  NcclBackend() = default;
  ~NcclBackend();
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  // Binds the calling (engine) thread to `device`'s primary context, takes the engine stream
  // and starts the completion thread. Once; later calls check that the device is the same.
  Status Start(int device, bool spin);
  bool started() const { return device_ >= 0; }
  int device() const { return device_; }

  // True when NCCL computes this reduction itself (with ncclAvg / ncclRedOpCreatePreMulSum
  // for Average and scale factors); otherwise the engine stages it through host memory.
  static bool CanReduce(DataType dtype, ReduceOp op, double prescale, double postscale);

  // The set's communicator. Collective over the set's members (MPI on ps.comm, then
  // ncclCommInitRank): call it at the same response on every member.
  Status Communicator(const ProcessSet& ps, gpu::ncclComm* out);

  // Work on the engine stream (engine thread only).
  Status WaitFor(const gpu::EventPtr& producer);
  Status CopyDeviceToDevice(void* dst, const void* src, int64_t bytes);
  Status Zero(void* dst, int64_t bytes);
  Status CopyDeviceToHost(void* dst, const void* src, int64_t bytes);
  Status CopyHostToDevice(void* dst, const void* src, int64_t bytes);
  Status Synchronize();
  // The device fusion buffer, at least `bytes` long (valid until the next call).
  Status FusionBuffer(int64_t bytes, void** out);
  // Device memory for an output, stream-ordered on the engine stream.
  Status AllocateOutput(int64_t bytes, std::shared_ptr<gpu::DeviceBuffer>* out);

  // Collectives of process set `set_id` on its communicator. Counts in elements for
  // reductions, in bytes for data movement; one entry per member where per-member.
  Status Allreduce(int32_t set_id, const void* in, void* out, int64_t count, DataType dtype, ReduceOp op, double prescale,
                   double postscale, int set_size);
  Status ReduceScatter(int32_t set_id, const void* in, void* out, const std::vector<int64_t>& counts, DataType dtype,
                       ReduceOp op, double prescale, double postscale, int me);
  Status Broadcast(int32_t set_id, const void* in, void* out, int64_t bytes, int root);
  Status Allgatherv(int32_t set_id, const void* in, void* out, const std::vector<int64_t>& counts,
                    const std::vector<int64_t>& displs, int me);
  Status Alltoallv(int32_t set_id, const void* in, const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs, void* out, const std::vector<int64_t>& recv_counts,
                   const std::vector<int64_t>& recv_displs, int me);

  // Aborts the set's communicator after a local failure (later operations on it fail with
  // `why` instead of running out of step with the other members).
  void Abort(int32_t set_id, const std::string& why);

  // `done` runs on the completion thread once everything enqueued so far on the stream has
  // finished (OK), or with the error that stopped it. `keep` is released after it ran.
  void Complete(int32_t set_id, Done done, std::vector<std::shared_ptr<void>> keep = {});

  // Waits (at most `grace_s`) for queued work, then fails what is left with `why`, aborts
  // communicators that are stuck and destroys the others. Idempotent.
  void Shutdown(const Status& why, double grace_s = 10.0);

 private:
  struct Comm {
    gpu::ncclComm comm = nullptr;
    std::string error;  // non-empty once failed (and aborted)
  };
  struct Pending {
    int32_t set_id;
    gpu::EventPtr event;  // null: recording failed, `status` says why
    Status status;
    Done done;
    std::vector<std::shared_ptr<void>> keep;
  };

  Status NcclStatus(int result, const char* call, gpu::ncclComm comm) const;
  // The set's live communicator under mu_ (error when it failed earlier or does not exist).
  Status Live(int32_t set_id, gpu::ncclComm* out);
  // Aborts the set's communicator and records why (first error wins). Takes mu_.
  void Fail(int32_t set_id, const std::string& error);
  Status ReduceOpFor(DataType dtype, ReduceOp op, double prescale, double postscale, int set_size, gpu::ncclComm comm,
                     int* nccl_op, bool* custom);
  Status Check(int result, const char* call, int32_t set_id, gpu::ncclComm comm);
  void CompletionLoop();
  Status WaitForEvent(const Pending& p);

  const gpu::CudaApi* cu_ = nullptr;
  const gpu::NcclApi* nccl_ = nullptr;
  int device_ = -1;
  bool spin_ = false;
  gpu::CUstream stream_ = nullptr;
  std::shared_ptr<gpu::DeviceBuffer> fusion_;

  std::mutex mu_;  // comms_ (the completion thread aborts), queue_, stopping_
  std::condition_variable cv_;
  std::map<int32_t, Comm> comms_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::chrono::steady_clock::time_point deadline_;
  Status why_;
  std::thread completer_;
};

}  // namespace collectives
