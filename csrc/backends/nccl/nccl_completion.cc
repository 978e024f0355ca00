// The NCCL backend's completion thread (nccl_completion.h).
#include "backends/nccl/nccl_completion.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "common/log.h"
#include "common/thread_name.h"
#include "gpu/gpu_runtime.h"

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

void NcclCompletion::Start(const GpuWaitLimits& limits) {
  limits_ = limits;
  thread_ = std::thread(&NcclCompletion::Loop, this);
}

void NcclCompletion::Complete(int32_t set_id, Done done, std::vector<std::shared_ptr<void>> keep) {
  Pending p;
  p.set_id = set_id;
  p.done = std::move(done);
  p.keep = std::move(keep);
  if (stream_.device() < 0) {
    p.done(Status::Error(StatusCode::INTERNAL, "internal: GPU completion without a GPU backend"));
    return;
  }
  gpu::EventPtr event;
  Status st = gpu::Runtime::Get().NewEvent(stream_.device(), &event);
  if (st.ok())
    st = CudaStatus(stream_.api()->EventRecord(event->get(), stream_.get()), "cuEventRecord on the engine stream");
  if (st.ok())
    p.event = std::move(event);
  else
    p.status = st;
  unfinished_.fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(p));
  cv_.notify_one();
}

void NcclCompletion::QueueRelease(int32_t set_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;  // Stop's caller destroys it
  Pending p;
  p.set_id = set_id;
  p.release = true;
  queue_.push_back(std::move(p));  // after every operation queued on the set so far
  cv_.notify_one();
}

Status NcclCompletion::WaitForEvent(const Pending& p) {
  using namespace std::chrono;
  const auto start = steady_clock::now();
  auto pause = microseconds(10);
  auto next_error_check = start;
  bool warned = false;
  for (int polls = 0;; ++polls) {
    const gpu::CUresult r = stream_.api()->EventQuery(p.event->get());
    if (r == CUDA_SUCCESS) break;
    // Anything but "not ready" is a device fault (sticky: the context is unusable).
    if (r != CUDA_ERROR_NOT_READY) return CudaStatus(r, "waiting for the GPU collective");
    const auto now = steady_clock::now();
    if (now >= next_error_check) {
      // A peer that died, a network failure: NCCL reports it here, and the kernels would
      // otherwise wait forever.
      next_error_check = now + milliseconds(1);
      const double waited = duration<double>(now - start).count();
      Status async = comms_.AsyncError(p.set_id);
      if (!async.ok()) return async;
      bool give_up = false;
      Status why;
      {
        std::lock_guard<std::mutex> lock(mu_);
        give_up = stopped_ && now >= deadline_;
        why = why_;
      }
      if (give_up) {
        // Shutting down and the GPU work does not finish: abort rather than hang the exit.
        comms_.FailAll("aborted at shutdown: GPU work did not finish");
        return Status::Error(why.code, why.message + " (GPU work did not finish)");
      }
      if (!warned && limits_.warn_s > 0 && waited > limits_.warn_s) {
        warned = true;
        Log(LogLevel::WARNING, "a GPU collective on process set " + std::to_string(p.set_id) +
                                   " has not finished after " + Seconds(waited) + "; a member may have stopped");
      }
      if (limits_.timeout_s > 0 && waited > limits_.timeout_s) {
        // A member that never launched its part, or a hung link: end the wait on every
        // member that gets here, rather than forever.
        const std::string why_timeout = "a GPU collective on process set " + std::to_string(p.set_id) +
                                        " did not finish within " + Seconds(limits_.timeout_s) +
                                        " (COLLECTIVES_STALL_SHUTDOWN_TIME_SECONDS); its NCCL communicator was aborted";
        comms_.Abort(p.set_id, why_timeout);
        return Status::Error(StatusCode::TIMEOUT, why_timeout);
      }
    }
    // Small collectives finish within microseconds: poll those quickly, then back off, to at
    // most 100 us between looks. The look's delay adds to every collective's latency: with
    // 1 ms, an 8-byte allreduce of two ranks on an H200 (NCCL over sockets, 2.5 ms raw) took
    // 0.94 ms longer than raw NCCL (docs/performance.md, "On a GPU"); a look each 100 us costs a core nothing
    // that matters, and only while GPU work is pending.
    if (limits_.spin && polls < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min<decltype(pause)>(pause * 2, microseconds(100));
    }
  }
  // Finished; but if the communicator was aborted meanwhile its kernels may have ended early.
  return comms_.Failure(p.set_id);
}

void NcclCompletion::Loop() {
  NameThisThread("coll-gpu-done");
  stream_.api()->CtxSetCurrent(gpu::Runtime::Get().Context(stream_.device()));
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
      comms_.Destroy(p.set_id);
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

bool NcclCompletion::Stop(const Status& why, double grace_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    stopped_ = true;
    why_ = why;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(grace_s));
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  return true;
}

}  // namespace collectives
