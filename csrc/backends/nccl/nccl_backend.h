// NCCL for tensors in GPU memory. One object per engine, used by the engine thread, on the
// process's one GPU: the engine's stream there, one communicator per process set (created on
// first use, in execution order, so every member creates it at the same response), the
// device fusion buffer (packed by the batched copy kernel of gpu_kernels.h when it loads),
// the NCCL calls, and a completion thread. Files: nccl_backend.cc (start-up, communicators,
// copies, NCCL calls), nccl_completion.cc (the completion thread, removal, shutdown).
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
// Locking: mu_ guards the communicator table and the completion queue, and is never held
// across an NCCL call that may block (launches, ncclGroupEnd, waiting out ncclInProgress);
// a communicator in use by the engine thread is aborted by that thread when its call
// returns, never under it.
#pragma once
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_api.h"
#include "gpu/gpu_kernels.h"
#include "gpu/gpu_runtime.h"
#include "operation/process_set.h"
#include "common/status.h"
#include "common/types.h"

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
  // A GPU wait is reported after `warn_s` and aborted after `timeout_s` (0: never).
  Status Start(int device, bool spin, double warn_s = 60.0, double timeout_s = 1800.0);
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
  // Several copies (a fused group's packing or unpacking): one launch of the batched copy
  // kernel per 64 when it is loaded, else one cuMemcpyDtoDAsync each. `scale` != 1 is
  // applied to float32/float64 elements and needs ScalesInKernel.
  Status CopyMany(const std::vector<gpu::Copy>& copies, DataType dtype, double scale = 1.0);
  // Whether every member of the set has the kernel (agreed when its communicator was made):
  // then a fused float32/float64 group's scale factors are applied in its copies, the same
  // way on every member, instead of by a PreMulSum operator.
  bool ScalesInKernel(int32_t set_id, DataType dtype);
  Status Zero(void* dst, int64_t bytes);
  Status CopyDeviceToHost(void* dst, const void* src, int64_t bytes);
  Status CopyHostToDevice(void* dst, const void* src, int64_t bytes);
  Status Synchronize();
  // The device fusion buffer, at least `bytes` long (valid until the next call).
  Status FusionBuffer(int64_t bytes, void** out);
  // Device memory for an output, stream-ordered on the engine stream.
  Status AllocateOutput(int64_t bytes, std::shared_ptr<gpu::DeviceBuffer>* out);

  // NCCL's reduction operator for a reduction: built in, or a PreMulSum operator carrying the
  // scale factors (and Average's 1/n) made for the set's communicator, which FreeRedOp
  // releases after the launch. NeedsCustomOp tells from the response alone whether one is made.
  struct RedOp {
    int op = 0;
    bool custom = false;
  };
  static bool NeedsCustomOp(DataType dtype, ReduceOp op, double prescale, double postscale);
  Status MakeRedOp(int32_t set_id, DataType dtype, ReduceOp op, double prescale, double postscale, int set_size,
                   RedOp* out);
  void FreeRedOp(int32_t set_id, const RedOp& op);

  // Collective over the set's members (MPI on ps.comm): OK when every member's `local` is;
  // otherwise every member gets the first failing member's reason, and none launches.
  Status Agree(const ProcessSet& ps, const Status& local);

  // Collectives of process set `set_id` on its communicator. Counts in elements for
  // reductions, in bytes for data movement; one entry per member where per-member.
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

  // Aborts the set's communicator after a local failure (later operations on it fail with
  // `why` instead of running out of step with the other members).
  void Abort(int32_t set_id, const std::string& why);

  // `done` runs on the completion thread once everything enqueued so far on the stream has
  // finished (OK), or with the error that stopped it. `keep` is released after it ran.
  void Complete(int32_t set_id, Done done, std::vector<std::shared_ptr<void>> keep = {});

  // Whether GPU work handed to Complete() has not finished yet (any thread). `idle` runs on
  // the completion thread each time the last of it finishes (set before the first Complete).
  bool Busy() const { return unfinished_.load(std::memory_order_acquire) > 0; }
  void OnIdle(std::function<void()> idle) { on_idle_ = std::move(idle); }

  // The process set was removed: its communicator (and NCCL's buffers for it) is destroyed
  // by the completion thread once the work queued before now has finished.
  void Release(int32_t set_id);

  // Waits (at most `grace_s`) for queued work, then fails what is left with `why`, aborts
  // communicators that are stuck and destroys the others. Idempotent.
  void Shutdown(const Status& why, double grace_s = 10.0);

 private:
  struct Comm {
    gpu::ncclComm comm = nullptr;
    std::string error;           // non-empty once failed (and aborted, or about to be)
    bool busy = false;           // the engine thread is inside an NCCL call on it
    bool abort_pending = false;  // failed while busy: the engine thread aborts it when the call returns
    bool kernel_everywhere = false;  // every member loaded the batched copy kernel
  };
  struct Pending {
    int32_t set_id;
    gpu::EventPtr event;  // null: recording failed, `status` says why
    Status status;
    Done done;
    std::vector<std::shared_ptr<void>> keep;
    bool release = false;  // not an operation: destroy the set's communicator (Release)
  };

  Status NcclStatus(int result, const char* call, gpu::ncclComm comm) const;
  // The set's live communicator under mu_ (error when it failed earlier or does not exist).
  Status Live(int32_t set_id, gpu::ncclComm* out);
  // Records why the set's communicator failed (first error wins) and aborts it, or leaves
  // that to the engine thread while it is inside a call on it. Under mu_.
  void FailLocked(int32_t set_id, const std::string& error);
  // Runs `calls` (NCCL calls on the set's live communicator, returning an NCCL result) on
  // the engine thread without mu_, waits out ncclInProgress, and fails the communicator when
  // the result is an error; `fail_comm` false: the error is returned only (local calls).
  Status WithComm(int32_t set_id, const char* what, const std::function<int(gpu::ncclComm)>& calls,
                  bool fail_comm = true);
  // ncclInProgress (non-blocking communicators): polls the communicator's state until the
  // operation is done, at most the wait timeout. Other results are returned as they are.
  int Settle(gpu::ncclComm comm, int result);
  void CompletionLoop();
  Status WaitForEvent(const Pending& p);
  void DestroyReleased(int32_t set_id);

  const gpu::CudaApi* cu_ = nullptr;
  const gpu::NcclApi* nccl_ = nullptr;
  int device_ = -1;
  bool spin_ = false;
  double warn_s_ = 60.0;
  double timeout_s_ = 1800.0;
  gpu::CUstream stream_ = nullptr;
  gpu::BatchedCopy kernel_;
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
  std::atomic<int64_t> allreduce_launches_{0};
  std::atomic<int> unfinished_{0};  // Complete() calls whose GPU work has not finished (or failed) yet
  std::function<void()> on_idle_;
};

}  // namespace collectives
