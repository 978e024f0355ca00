// What ranks tell each other during negotiation: requests (one rank's view of a named
// tensor) and responses (the coordinator's decision that every rank executes), and their
// byte encoding for the MPI gather/broadcast of the negotiation phase.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/types.h"

namespace collectives {

struct Request {
  std::string name;
  OpType op = OpType::ALLREDUCE;
  DataType dtype = DataType::FLOAT32;
  ReduceOp reduce_op = ReduceOp::SUM;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> shape;
  std::vector<int64_t> splits;  // alltoall: first-dimension rows sent to each rank
  int32_t device = -1;          // -1: host memory
  std::string group;            // grouped requests share a group name ...
  int32_t group_size = 0;       // ... and know how many members it has
  int32_t process_set = 0;      // 0: every rank
  // Non-empty: this rank could not submit the tensor (bad input found locally) and says why,
  // so that the other ranks fail the same name instead of waiting for it (an "error
  // submission", negotiated like any request and never cached).
  std::string failure;
  // Not part of the identity of a request: filled in when sent to the coordinator.
  int32_t rank = 0;
  int64_t age_ms = 0;

  // True when two requests describe the same collective call on this rank (used by the
  // response cache: a steady-state step resubmits the same signature every time).
  bool SameSignature(const Request& o) const;
};

struct Response {
  std::string name;
  OpType op = OpType::ALLREDUCE;
  DataType dtype = DataType::FLOAT32;
  ReduceOp reduce_op = ReduceOp::SUM;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t device = -1;
  std::string group;
  int32_t group_size = 0;
  int32_t process_set = 0;
  std::vector<int64_t> shape;         // the (first submitting rank's) tensor shape: lets a
                                      // joined rank take part in an allreduce it never submitted
  std::string error;                  // non-empty: every rank fails this tensor with it
  std::vector<int64_t> rank_dim0;     // allgather: first dimension of each member's input
  std::vector<int64_t> split_matrix;  // alltoall: n x n rows over the set's members, [src * n + dst];
                                      // process-set creation: the member ranks
};

// Coordinator broadcast: the responses of a cycle plus engine-wide decisions.
struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;       // stall shutdown decided by the coordinator
  std::string shutdown_reason;
};

std::string EncodeRequests(const std::vector<Request>& reqs);
bool DecodeRequests(const char* data, size_t len, std::vector<Request>* out);
std::string EncodeResponseList(const ResponseList& list);
bool DecodeResponseList(const char* data, size_t len, ResponseList* out);

}  // namespace collectives
