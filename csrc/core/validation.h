// Local validation of a request at enqueue time (no communication): names, dtypes, shapes,
// roots, splits, control-request arguments. Cross-rank agreement is the coordinator's job.
#pragma once
#include <vector>

#include "operation/message.h"
#include "common/status.h"

namespace collectives {

// `members`: the global ranks of the request's process set; `job_size`: ranks in the job.
// `has_buffers`: the caller gave both input and output memory. May fill in defaults
// (equal alltoall splits).
Status ValidateSubmission(Request* request, bool has_buffers, const std::vector<int>& members, int job_size);

}  // namespace collectives
