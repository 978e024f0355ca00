// The NCCL communicators, one per process set (nccl_backend.h): made on first use, in execution
// order, so that every member makes it at the same response; the NCCL calls on them, each
// result checked; the agreement of a set's members before a launch; and their failures: an NCCL
// call that fails, or an asynchronous error the completion thread finds, aborts the set's
// communicator (ncclCommAbort, never a process abort), and every later operation on that set
// fails with NCCL's own message.
//
// Locking: mu_ guards the table, and is never held across an NCCL call that may block
// (launches, ncclGroupEnd, waiting out ncclInProgress); a communicator in use by the engine
// thread is aborted by that thread when its call returns, never under it. The engine thread
// makes and uses communicators; the completion thread checks, fails and destroys them.
#pragma once
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "common/status.h"
#include "common/types.h"
#include "gpu/gpu_api.h"
#include "operation/process_set.h"

namespace collectives {

class NcclCommunicators {
 public:
  // NCCL's entry points (null: this rank has no GPU backend); a call in progress
  // (non-blocking communicators) is waited out at most `timeout_s` (0: no limit).
  void Start(const gpu::NcclApi* nccl, double timeout_s);

  // The set's communicator. Collective over the set's members (MPI on ps.comm, then
  // ncclCommInitRank): call it at the same response on every member. `usable`: why this rank
  // cannot take part (OK: it can); `copy_kernel`: this rank loaded the batched copy kernel.
  Status Get(const ProcessSet& ps, const Status& usable, bool copy_kernel, gpu::ncclComm* out);
  // Collective over the set's members (MPI on ps.comm): OK when every member's `local` is;
  // otherwise every member gets the first failing member's reason, and none launches.
  static Status Agree(const ProcessSet& ps, const Status& local);
  // Whether every member of the set has the copy kernel (agreed when its communicator was made):
  // then a fused float32/float64 group's scale factors are applied in its copies.
  bool ScalesInKernel(int32_t set_id, DataType dtype);

  // Runs `calls` (NCCL calls on the set's live communicator, returning an NCCL result) on the
  // engine thread without mu_, waits out ncclInProgress, and fails the communicator when the
  // result is an error; `fail_comm` false: the error is returned only (local calls).
  Status With(int32_t set_id, const char* what, const std::function<int(gpu::ncclComm)>& calls,
              bool fail_comm = true);
  // Aborts the set's communicator after a local failure (later operations on it fail with
  // `why` instead of running out of step with the other members).
  void Abort(int32_t set_id, const std::string& why);

  // The completion thread's: an asynchronous error of the set's communicator (which fails it),
  // or OK; every communicator failed with `why` (a shutdown whose GPU work does not finish);
  // the set's failure so far, or OK.
  Status AsyncError(int32_t set_id);
  void FailAll(const std::string& why);
  Status Failure(int32_t set_id);

  // The process set was removed (or the backend shuts down): its communicator is destroyed,
  // or just forgotten when it failed (it was aborted then).
  bool Has(int32_t set_id);
  void Destroy(int32_t set_id);
  void DestroyAll();

 private:
  struct Comm {
    gpu::ncclComm comm = nullptr;
    std::string error;           // non-empty once failed (and aborted, or about to be)
    bool busy = false;           // the engine thread is inside an NCCL call on it
    bool abort_pending = false;  // failed while busy: the engine thread aborts it when the call returns
    bool kernel_everywhere = false;  // every member loaded the batched copy kernel
  };

  Status NcclStatus(int result, const char* call, gpu::ncclComm comm) const;
  // The set's live communicator under mu_ (error when it failed earlier or does not exist).
  Status Live(int32_t set_id, gpu::ncclComm* out);
  // Records why the set's communicator failed (first error wins) and aborts it, or leaves
  // that to the engine thread while it is inside a call on it. Under mu_.
  void FailLocked(int32_t set_id, const std::string& error);
  // ncclInProgress (non-blocking communicators): polls the communicator's state until the
  // operation is done, at most the timeout. Other results are returned as they are.
  int Settle(gpu::ncclComm comm, int result);

  const gpu::NcclApi* nccl_ = nullptr;
  double timeout_s_ = 1800.0;
  std::mutex mu_;
  std::map<int32_t, Comm> comms_;
};

}  // namespace collectives
