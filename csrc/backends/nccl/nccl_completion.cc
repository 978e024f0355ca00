// NcclBackend's completion thread: it waits on the host for the event recorded after each
// group of GPU work, checks the communicator for asynchronous errors meanwhile, gives up
// after the stall shutdown time, completes the handles, and destroys the communicators of
// removed process sets once their work is done. Also the backend's shutdown.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "gpu/gpu_loader.h"
#include "common/log.h"
#include "backends/nccl/nccl_backend.h"
#include "common/thread_name.h"

namespace collectives {
namespace {

using gpu::CUDA_ERROR_NOT_READY;
using gpu::CUDA_SUCCESS;
using gpu::CudaStatus;

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

}  // namespace

void NcclBackend::Complete(int32_t set_id, Done done, std::vector<std::shared_ptr<void>> keep) {
  Pending p;
  p.set_id = set_id;
  p.done = std::move(done);
  p.keep = std::move(keep);
  if (device_ < 0) {
    p.done(Status::Error(StatusCode::INTERNAL, "internal: GPU completion without a GPU backend"));
    return;
  }
  gpu::EventPtr event;
  Status st = gpu::Runtime::Get().NewEvent(device_, &event);
  if (st.ok()) st = CudaStatus(cu_->EventRecord(event->get(), stream_), "cuEventRecord on the engine stream");
  if (st.ok())
    p.event = std::move(event);
  else
    p.status = st;
  unfinished_.fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(p));
  cv_.notify_one();
}

void NcclBackend::Release(int32_t set_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(set_id);
  if (it == comms_.end()) return;  // never used on a GPU
  if (!completer_.joinable()) {    // never started here: no communicator was made
    comms_.erase(it);
    return;
  }
  if (stopped_) return;  // Shutdown destroys it
  Pending p;
  p.set_id = set_id;
  p.release = true;
  queue_.push_back(std::move(p));  // after every operation queued on the set so far
  cv_.notify_one();
}

void NcclBackend::DestroyReleased(int32_t set_id) {
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

Status NcclBackend::WaitForEvent(const Pending& p) {
  using namespace std::chrono;
  const auto start = steady_clock::now();
  auto pause = microseconds(10);
  auto next_error_check = start;
  bool warned = false;
  for (int polls = 0;; ++polls) {
    const gpu::CUresult r = cu_->EventQuery(p.event->get());
    if (r == CUDA_SUCCESS) break;
    // Anything but "not ready" is a device fault (sticky: the context is unusable).
    if (r != CUDA_ERROR_NOT_READY) return CudaStatus(r, "waiting for the GPU collective");
    const auto now = steady_clock::now();
    if (now >= next_error_check) {
      // A peer that died, a network failure: NCCL reports it here, and the kernels would
      // otherwise wait forever.
      next_error_check = now + milliseconds(1);
      const double waited = duration<double>(now - start).count();
      std::lock_guard<std::mutex> lock(mu_);
      auto it = comms_.find(p.set_id);
      if (it != comms_.end() && it->second.comm) {
        gpu::ncclResult async = gpu::ncclSuccess;
        nccl_->CommGetAsyncError(it->second.comm, &async);
        if (async != gpu::ncclSuccess && async != gpu::ncclInProgress) {
          Status st = NcclStatus(async, "a collective (asynchronous error)", it->second.comm);
          FailLocked(p.set_id, st.message);
          return st;
        }
      }
      if (stopping_ && now >= deadline_) {
        // Shutting down and the GPU work does not finish: abort rather than hang the exit.
        for (auto& kv : comms_) FailLocked(kv.first, "aborted at shutdown: GPU work did not finish");
        return Status::Error(why_.code, why_.message + " (GPU work did not finish)");
      }
      if (!warned && warn_s_ > 0 && waited > warn_s_) {
        warned = true;
        Log(LogLevel::WARNING, "a GPU collective on process set " + std::to_string(p.set_id) +
                                   " has not finished after " + Seconds(waited) + "; a member may have stopped");
      }
      if (timeout_s_ > 0 && waited > timeout_s_) {
        // A member that never launched its part, or a hung link: end the wait on every
        // member that gets here, rather than forever.
        const std::string why = "a GPU collective on process set " + std::to_string(p.set_id) +
                                " did not finish within " + Seconds(timeout_s_) +
                                " (COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS); its NCCL communicator was aborted";
        FailLocked(p.set_id, why);
        return Status::Error(StatusCode::TIMEOUT, why);
      }
    }
    // Small collectives finish within microseconds: poll those quickly, then back off, to at
    // most 100 us between looks. The look's delay adds to every collective's latency: with
    // 1 ms, an 8-byte allreduce of two ranks on an H200 (NCCL over sockets, 2.5 ms raw) took
    // 0.94 ms longer than raw NCCL (docs/performance.md, "On a GPU"); a look each 100 us costs a core nothing
    // that matters, and only while GPU work is pending.
    if (spin_ && polls < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min<decltype(pause)>(pause * 2, microseconds(100));
    }
  }
  // Finished; but if the communicator was aborted meanwhile its kernels may have ended early.
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(p.set_id);
  if (it != comms_.end() && !it->second.error.empty())
    return Status::Error(StatusCode::INTERNAL, "the NCCL communicator of process set " + std::to_string(p.set_id) +
                                                   " failed: " + it->second.error);
  return Status::Ok();
}

void NcclBackend::CompletionLoop() {
  NameThisThread("coll-gpu-done");
  gpu::Runtime& rt = gpu::Runtime::Get();
  cu_->CtxSetCurrent(rt.Context(device_));
  while (true) {
    Pending p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || stopped_; });
      if (queue_.empty()) return;  // stopped and drained
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    if (p.release) {
      DestroyReleased(p.set_id);
      continue;
    }
    Status st = p.event ? WaitForEvent(p) : p.status;
    p.event.reset();
    // The GPU is done with it: before the handles complete, so that a caller woken by them
    // finds the GPU idle (HoldForGpuFusion, engine_wake.cc).
    if (unfinished_.fetch_sub(1, std::memory_order_acq_rel) == 1 && on_idle_) on_idle_();
    p.done(st);  // completes handles: takes the engine's locks, never calls Python
    p.keep.clear();
  }
}

void NcclBackend::Shutdown(const Status& why, double grace_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopping_ = true;
    stopped_ = true;
    why_ = why;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(grace_s));
  }
  cv_.notify_all();
  if (completer_.joinable()) completer_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : comms_)
    if (kv.second.comm) nccl_->CommDestroy(kv.second.comm);  // idle now: the queue is drained
  comms_.clear();
  fusion_.reset();
}

}  // namespace collectives
