// The engine's settings, from collectives/config.py's knobs (core/engine.h's Engine::Start).
// Apart from engine.h so that the engine's parts (cycle_driver.h) can read them.
#pragma once
#include <cstdint>
#include <string>

#include "monitor/autotune.h"

namespace collectives {

struct EngineConfig {
  int64_t fusion_threshold = 128LL * 1024 * 1024;
  double cycle_time_ms = 1.0;
  int cache_capacity = 1024;
  std::string timeline_path;
  bool timeline_mark_cycles = false;
  double stall_check_s = 60.0;
  double stall_shutdown_s = 1800.0;  // collectives/config.py's default
  double init_timeout_s = 300.0;     // Start gives up when not every rank arrives; 0: never
  double finalize_timeout_s = 1800.0;  // MPI_Finalize at exit gives up after this (process_exit.h); 0: never
  int64_t buffer_pool_bytes = 32LL * 1024 * 1024;  // idle host buffers kept for reuse (buffer_pool.h)
  bool hierarchical_allreduce = false;  // host memory, whole job: within hosts, then across (hierarchical.h)
  bool hierarchical_allgather = false;
  bool shm_allreduce = true;  // host allreduces through shared memory on one host (shm_allreduce.h)
  bool cma_allreduce = true;  // large host allreduces by cross-memory attach on one host (cross_memory_allreduce.h)
  bool shm_negotiation = true;  // the negotiation's exchange through shared memory on one host (shared_exchange.h)
  bool caller_cycles = true;  // a caller waiting for its result runs the cycles itself (engine_inline.cc)
  bool gpu_fusion_wait = true;  // GPU work waits while the GPU is busy, to fuse (engine_wake.cc)
  double gpu_fusion_wait_ms = 100.0;  // ... at most this long after the oldest of it arrived
  AutotuneSettings autotune;  // COLLECTIVES_AUTOTUNE and friends (autotune.h)
  // GPU libraries found by Python (collectives/gpu_libs.py), loaded at Start.
  std::string cuda_driver_library = "libcuda.so.1";
  std::string nccl_library;  // empty: not found, and nccl_problem says why
  std::string nccl_problem;
};

}  // namespace collectives
