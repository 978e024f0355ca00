// Autotuning of the engine's parameters (Horovod's HOROVOD_AUTOTUNE): during the first steps of
// a job the engine tries settings of the fusion threshold, the cycle time and, where the job's
// layout allows them, the hierarchical allreduce and allgather, scores each from the bytes it
// moved per second, and then keeps the best for the rest of the job.
//
// Protocol. The engine reports every cycle's work (Count, EndCycle) on every rank. What decides
// the end of a sample is the names of the executed tensors, which are identical on every rank
// (every rank executes the same response list), so every rank reaches a decision point in the
// same cycle. There rank 0 scores the sample with its own clock and picks the next candidate
// (Decide), the engine broadcasts the packed parameters on its communicator, and every rank
// applies them (Apply) before the next cycle. Warm-up samples are discarded without a
// broadcast; once tuning ends, EndCycle is not called any more: no cost at all.
//
// Steps and samples, as Horovod counts them: a step is one more execution of some tensor name;
// a score covers steps_per_sample steps (score k ends in the cycle where some name has been
// executed (k + 1) x steps_per_sample times since tuning began) and is the bytes executed over the wall time from its first working cycle's
// start to its last one's end (the computation between steps included: that is throughput);
// a sample is the median of kScoresPerSample such scores, which shrugs off a noisy neighbour.
//
// Search: coordinate descent over small candidate sets, instead of Horovod's Bayesian
// optimisation. Why: a Gaussian process over (fusion threshold, cycle time) needs more samples
// than a short tuning phase has to beat a grid, and on this engine the two parameters barely
// interact (the cycle time only paces cycles while some rank waits for a peer: new work and a
// peer's wake start a cycle at once; the fusion threshold only bounds how many small host
// tensors, each at most 64 KiB, share one buffer). So each coordinate is searched on its own,
// the others at their best so far: the starting (configured) point first, then the fusion
// threshold's candidates, the cycle time's, hierarchical allreduce on/off, allgather on/off; a
// challenger replaces the best only when it scores kMinGain better, so noise alone does not
// move the job away from its configured settings. Then, when the winner is not the starting point,
// both are measured once more and the winner stays only if it wins again by kMinGain. About 12 samples in
// all; max_samples caps the search (the rematch's two samples come on top).
// A parameter the user set explicitly is not searched.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

#include "common/status.h"
#include "monitor/autotune_sampling.h"
#include "monitor/autotune_search.h"
#include "monitor/tuned_params.h"

namespace collectives {

// A snapshot for Python (any thread).
struct AutotuneState {
  bool enabled = false;
  bool tuning = false;  // still searching; false once the best is fixed (or when not enabled)
  TunedParams params;   // in force now
  int samples = 0;      // scored samples so far (warm-up ones not counted)
  double best_score = 0;  // bytes per microsecond of the best sample (rank 0's clock)
};

class Autotuner {
 public:
  using Clock = SampleScorer::Clock;
  static constexpr int kPackedSize = 7;  // doubles broadcast at a decision point

  // `hierarchical_*_possible`: the job's layout allows the algorithm (hierarchical.h). Rank 0
  // opens the log. Tuning starts at once when something is left to tune.
  Status Start(const AutotuneSettings& settings, const TunedParams& initial, int rank,
               bool hierarchical_allreduce_possible, bool hierarchical_allgather_possible);
  // The ranks disagree on the knobs that place the decision points: no tuning (the starting values stay).
  void Cancel();
  // Engine thread only: whether EndCycle must still be called.
  bool tuning() const { return tuning_; }

  // One executed data operation of the current cycle (every rank, the same names in each cycle).
  void Count(const std::string& name, int64_t bytes) { scorer_.Count(name, bytes); }
  // The cycle that started at `start` is over. True: a decision point, the same cycle on every
  // rank; rank 0 then calls Decide, the engine broadcasts the packed doubles, every rank Applies.
  bool EndCycle(Clock::time_point start, Clock::time_point end) { return scorer_.EndCycle(start, end); }
  // Rank 0: scores the finished sample, logs it, chooses what comes next.
  void Decide(double packed[kPackedSize]);
  // Every rank: the parameters to use from the next cycle on (and whether tuning goes on).
  TunedParams Apply(const double packed[kPackedSize]);

  AutotuneState state() const;

 private:
  bool tuning_ = false;
  SampleScorer scorer_;     // every rank
  ParameterSearch search_;  // rank 0 decides

  mutable std::mutex state_mu_;
  AutotuneState state_;  // under state_mu_
};

}  // namespace collectives
