// The autotuner's search (autotune.h), on rank 0: one coordinate at a time over a few values
// each, a challenger kept when it beats the best by kMinGain, then a rematch of the winner
// against the starting point; and its CSV log, with Horovod's columns. Engine thread.
#pragma once
#include <fstream>
#include <string>
#include <vector>

#include "monitor/tuned_params.h"

namespace collectives {

// "fusion threshold 1 MiB, cycle time 2.5 ms, ...", for the log lines.
std::string DescribeTunedParams(const TunedParams& p);

class ParameterSearch {
 public:
  static constexpr double kMinGain = 0.03;  // a challenger must beat the best by 3%

  // `hierarchical_*_possible`: the job's layout allows the algorithm (hierarchical.h). Whether
  // anything is left to tune.
  bool Start(const AutotuneSettings& settings, const TunedParams& initial, bool hierarchical_allreduce_possible,
             bool hierarchical_allgather_possible);
  // Rank 0: an unwritable log is a warning, not an error.
  void OpenLog(const std::string& path);
  void CloseLog() { log_.close(); }
  // Scores the finished sample, logs it, chooses what comes next. False: the search is over, and
  // *next holds the parameters kept.
  bool Decide(double score, TunedParams* next);
  int scored() const { return scored_; }
  double best_score() const { return best_score_; }

 private:
  enum Coordinate { FUSION, CYCLE, HIER_ALLREDUCE, HIER_ALLGATHER, NUM_COORDINATES };
  TunedParams With(Coordinate c, double value) const;  // best_ with one coordinate changed
  bool NextCandidate();                                // sets current_; false when the search is over
  void WriteRow(const TunedParams& p, double score);

  int max_samples_ = 0;
  bool cache_enabled_ = true;  // the log's column
  std::vector<double> candidates_[NUM_COORDINATES];  // values to try per coordinate (empty: fixed)
  int coordinate_ = -1, next_index_ = 0;
  TunedParams start_, current_, best_;
  // After the search, a winner other than the starting point is measured once more against it
  // (start first, then the winner): one lucky sample on a noisy machine does not decide.
  enum Phase { SEARCH, REMATCH_START, REMATCH_BEST } phase_ = SEARCH;
  double start_rematch_ = 0;
  double best_score_ = -1;  // < 0: the starting point is not scored yet
  int scored_ = 0;
  std::ofstream log_;
};

}  // namespace collectives
