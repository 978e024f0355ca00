// The clock of the engine's timestamps: enqueue and pick-up times, stall checks, cycle deadlines.
#pragma once
#include <chrono>

namespace collectives {

using Clock = std::chrono::steady_clock;

}  // namespace collectives
