// The NCCL communicators of the process sets (nccl_communicators.h).
#include "backends/nccl/nccl_communicators.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/log.h"

namespace collectives {
namespace {

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

}  // namespace

void NcclCommunicators::Start(const gpu::NcclApi* nccl, double timeout_s) {
  nccl_ = nccl;
  timeout_s_ = timeout_s;
}

Status NcclCommunicators::NcclStatus(int result, const char* call, gpu::ncclComm comm) const {
  std::string msg = std::string("NCCL error in ") + call + ": ";
  msg += nccl_ ? nccl_->GetErrorString(result) : "error " + std::to_string(result);
  if (nccl_ && nccl_->GetLastError) {
    const char* last = nccl_->GetLastError(comm);
    if (last && *last) msg += std::string(" (") + last + ")";
  }
  return Status::Error(StatusCode::INTERNAL, msg);
}

Status NcclCommunicators::Live(int32_t set_id, gpu::ncclComm* out) {
  auto it = comms_.find(set_id);
  if (it == comms_.end() || !it->second.comm || !it->second.error.empty())
    return Status::Error(StatusCode::INTERNAL,
                         it == comms_.end() ? "internal: no NCCL communicator for process set " + std::to_string(set_id)
                                            : "the NCCL communicator of process set " + std::to_string(set_id) +
                                                  " failed earlier: " + it->second.error);
  *out = it->second.comm;
  return Status::Ok();
}

void NcclCommunicators::FailLocked(int32_t set_id, const std::string& error) {
  Comm& c = comms_[set_id];
  if (c.error.empty()) {
    c.error = error;
    Log(LogLevel::ERROR, "aborting the NCCL communicator of process set " + std::to_string(set_id) + ": " + error);
  }
  if (!c.comm) return;
  if (c.busy) {
    c.abort_pending = true;  // the engine thread is inside a call on it: it aborts on return
    return;
  }
  if (nccl_) nccl_->CommAbort(c.comm);  // ends its kernels; never the process
  c.comm = nullptr;
}

void NcclCommunicators::Abort(int32_t set_id, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (comms_.count(set_id)) FailLocked(set_id, why);
}

int NcclCommunicators::Settle(gpu::ncclComm comm, int result) {
  if (result != gpu::ncclInProgress) return result;
  using namespace std::chrono;
  const auto start = steady_clock::now();
  auto pause = microseconds(10);
  while (true) {
    gpu::ncclResult state = gpu::ncclSuccess;
    const int r = nccl_->CommGetAsyncError(comm, &state);
    if (r != gpu::ncclSuccess) return r;
    if (state != gpu::ncclInProgress) return state;
    if (timeout_s_ > 0 && duration<double>(steady_clock::now() - start).count() > timeout_s_) return gpu::ncclInProgress;
    std::this_thread::sleep_for(pause);
    pause = std::min<decltype(pause)>(pause * 2, microseconds(1000));
  }
}

Status NcclCommunicators::With(int32_t set_id, const char* what, const std::function<int(gpu::ncclComm)>& calls,
                             bool fail_comm) {
  gpu::ncclComm comm;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = Live(set_id, &comm);
    if (!st.ok()) return st;
    comms_[set_id].busy = true;
  }
  const int r = Settle(comm, calls(comm));  // without mu_: launches and ncclGroupEnd may block
  Status st;
  if (r == gpu::ncclInProgress)
    st = Status::Error(StatusCode::TIMEOUT, std::string(what) + " on process set " + std::to_string(set_id) +
                                                " was still in progress after " + Seconds(timeout_s_) +
                                                " (COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS)");
  else if (r != gpu::ncclSuccess)
    st = NcclStatus(r, what, comm);
  std::lock_guard<std::mutex> lock(mu_);
  Comm& c = comms_[set_id];
  c.busy = false;
  if (!st.ok() && fail_comm) FailLocked(set_id, st.message);
  if (c.abort_pending) {  // the completion thread found it failed while we were inside
    c.abort_pending = false;
    if (c.comm) nccl_->CommAbort(c.comm);
    c.comm = nullptr;
  }
  if (st.ok() && !c.error.empty())
    return Status::Error(StatusCode::INTERNAL,
                         "the NCCL communicator of process set " + std::to_string(set_id) + " failed: " + c.error);
  return st;
}

Status NcclCommunicators::Get(const ProcessSet& ps, const Status& usable, bool copy_kernel, gpu::ncclComm* out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = comms_.find(ps.id);
    if (it != comms_.end()) return Live(ps.id, out);
  }
  // Every member states whether it can take part before any of them blocks in
  // ncclCommInitRank; a member that cannot (no GPU, no NCCL) fails the set on every member
  // instead of leaving the others waiting.
  Status local = usable;
  gpu::ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (local.ok() && ps.set_rank == 0) {
    int r = nccl_->GetUniqueId(&id);
    if (r != gpu::ncclSuccess) local = NcclStatus(r, "ncclGetUniqueId", nullptr);
  }
  Status st = Agree(ps, local);
  gpu::ncclComm comm = nullptr;
  if (st.ok()) {
    // The id travels over the set's MPI communicator, by the engine thread, at the same
    // response on every member.
    if (MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, ps.comm) != MPI_SUCCESS)
      return Status::Error(StatusCode::INTERNAL, "MPI_Bcast of the NCCL unique id failed");
    int r = nccl_->CommInitRank(&comm, ps.size(), id, ps.set_rank);
    if (r == gpu::ncclInProgress && comm) r = Settle(comm, r);  // NCCL_COMM_BLOCKING=0
    Status made;
    if (r != gpu::ncclSuccess) made = NcclStatus(r, "ncclCommInitRank", comm);
    // All members keep the communicator, or none does (one that half-failed would hang the others).
    st = Agree(ps, made);
    if (!st.ok() && comm) {
      nccl_->CommAbort(comm);
      comm = nullptr;
    }
  }
  int kernel_here = st.ok() && copy_kernel ? 1 : 0, kernel_everywhere = 0;
  if (st.ok() && MPI_Allreduce(&kernel_here, &kernel_everywhere, 1, MPI_INT, MPI_MIN, ps.comm) != MPI_SUCCESS)
    kernel_everywhere = 0;  // cannot happen after the agreement above; copies are always right
  std::lock_guard<std::mutex> lock(mu_);
  Comm& c = comms_[ps.id];
  c.comm = comm;
  c.error = st.message;
  c.kernel_everywhere = kernel_everywhere != 0;
  if (!st.ok()) return st;
  *out = comm;
  return Status::Ok();
}

Status NcclCommunicators::Agree(const ProcessSet& ps, const Status& local) {
  // The lowest member that failed, then its reason for everyone: two small MPI calls on the
  // set's communicator, by the engine thread, at the same response on every member.
  int mine = local.ok() ? INT_MAX : ps.set_rank, first = INT_MAX;
  if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, ps.comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "MPI_Allreduce agreeing on a GPU collective failed");
  if (first == INT_MAX) return Status::Ok();
  char reason[512] = {};
  if (first == ps.set_rank) std::strncpy(reason, local.message.c_str(), sizeof(reason) - 1);
  if (MPI_Bcast(reason, static_cast<int>(sizeof(reason)), MPI_CHAR, first, ps.comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, "MPI_Bcast of a GPU collective's failure failed");
  reason[sizeof(reason) - 1] = '\0';
  const std::string who = "rank " + std::to_string(ps.ranks[static_cast<size_t>(first)]);
  if (!local.ok() && first == ps.set_rank)
    return Status::Error(local.code, local.message + " (" + who + "; no member of process set " +
                                         std::to_string(ps.id) + " ran this GPU collective)");
  return Status::Error(StatusCode::INTERNAL, who + " could not take part, so no member of process set " +
                                                 std::to_string(ps.id) + " ran this GPU collective: " + reason);
}

bool NcclCommunicators::ScalesInKernel(int32_t set_id, DataType dtype) {
  if (dtype != DataType::FLOAT32 && dtype != DataType::FLOAT64) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(set_id);
  return it != comms_.end() && it->second.kernel_everywhere;
}

Status NcclCommunicators::AsyncError(int32_t set_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(set_id);
  if (it == comms_.end() || !it->second.comm) return Status::Ok();
  gpu::ncclResult async = gpu::ncclSuccess;
  nccl_->CommGetAsyncError(it->second.comm, &async);
  if (async == gpu::ncclSuccess || async == gpu::ncclInProgress) return Status::Ok();
  Status st = NcclStatus(async, "a collective (asynchronous error)", it->second.comm);
  FailLocked(set_id, st.message);
  return st;
}

void NcclCommunicators::FailAll(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : comms_) FailLocked(kv.first, why);
}

Status NcclCommunicators::Failure(int32_t set_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(set_id);
  if (it == comms_.end() || it->second.error.empty()) return Status::Ok();
  return Status::Error(StatusCode::INTERNAL,
                       "the NCCL communicator of process set " + std::to_string(set_id) + " failed: " + it->second.error);
}

bool NcclCommunicators::Has(int32_t set_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return comms_.count(set_id) != 0;
}

void NcclCommunicators::Destroy(int32_t set_id) {
  gpu::ncclComm comm = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = comms_.find(set_id);
    if (it == comms_.end()) return;
    comm = it->second.comm;  // null when it failed (already aborted)
    comms_.erase(it);        // the set is gone: nothing uses its communicator any more
  }
  if (comm) nccl_->CommDestroy(comm);
}

void NcclCommunicators::DestroyAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : comms_)
    if (kv.second.comm) nccl_->CommDestroy(kv.second.comm);  // idle now: the completion queue is drained
  comms_.clear();
}

}  // namespace collectives
