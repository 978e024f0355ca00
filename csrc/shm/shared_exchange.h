// An allgather of small records among the ranks of a job that runs on one host, through memory
// they share: the negotiation's exchange in every cycle (fused_negotiation.h) on such jobs.
//
// Why: MPI's negotiation allreduce costs what an MPI allreduce of its ~350 bytes costs, ~5-8 us
// between two ranks on the 2-core VM (a nonblocking MPI_Iallreduce with a user-defined reduction,
// completed by MPI_Test), the largest part of a small allreduce's time. Here a rank writes its
// record, publishes a counter, and reads the others' records once their counters show the same
// exchange; each rank then combines the records itself, in rank order, so every rank computes
// bit-identical results.
//
// Layout: per rank, one line with its counter and its count of sleepers, and two record slots
// used alternately. A rank writes the slot of exchange k+2 only after every peer published
// exchange k+1, which each does only after it finished reading exchange k: a record stays valid
// until its reader's next exchange.
//
// Waiting: as wait_policy.h says (spin, then yield), then asleep on the peer's counter (a futex
// word), woken by the peer when it publishes. Every 20 ms a sleeper looks whether the peer
// process has exited (then the exchange fails, naming it) and whether its wait was aborted (the
// watchdog, mpi_wait.h's SetWaitAbort). The segment is a local munmap away: nothing collective
// that a dead rank could block.
#pragma once
#include <mpi.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "shm/shared_word.h"
#include "common/status.h"

namespace collectives {

class SharedExchange {
 public:
  ~SharedExchange() { Release(); }

  // Collective over `comm`. Maps the segment when `enabled`, the job has more than one rank and
  // all are on this host (`local_size == size`); otherwise, or when some rank cannot map it (every
  // rank then agrees), the exchange is inactive and blocker() says why. `record_bytes`: the most
  // a record holds. An error only when MPI fails.
  Status Init(MPI_Comm comm, int local_size, bool enabled, size_t record_bytes);
  void Release();

  bool active() const { return base_ != nullptr; }
  const std::string& blocker() const { return blocker_; }

  // Where this rank writes its record of the next exchange (the record's size given at Init at
  // most): written in place, it needs no copy.
  void* Outgoing() { return Slot(rank_, exchanges_ + 1); }
  // Publishes this rank's record (written at Outgoing()) and waits for every rank's record of the
  // same exchange. Fails (INTERNAL) when a peer exited or the wait was aborted (WaitAborted).
  Status Exchange();
  // Rank r's record of the last exchange.
  const uint64_t* Record(int rank) const { return reinterpret_cast<const uint64_t*>(Slot(rank, exchanges_)); }

 private:
  // Per rank: the count of exchanges it has published (shared_word.h).
  using Line = SharedWord;
  Line* LineOf(int rank) const { return reinterpret_cast<Line*>(base_) + rank; }
  char* Slot(int rank, uint64_t exchange) const {
    return slots_ + (static_cast<size_t>(rank) * 2 + (exchange & 1)) * slot_bytes_;
  }
  Status WaitFor(int rank, uint32_t target);

  char* base_ = nullptr;  // the mapping: lines, then slots
  char* slots_ = nullptr;
  size_t bytes_ = 0, slot_bytes_ = 0;
  int rank_ = 0, size_ = 0;
  uint64_t exchanges_ = 0;  // the same count on every rank
  std::vector<pid_t> pids_;
  std::string blocker_ = "not set up";
};

}  // namespace collectives
