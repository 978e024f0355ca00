// The monitor calls that are more than one line (engine_monitoring.h).
#include "core/engine_monitoring.h"

namespace collectives {

Status EngineMonitoring::StartTimeline(const std::string& path, bool mark_cycles) {
  if (job_.rank != 0) return Status::Ok();  // rank 0 writes the timeline for everyone
  return monitors_.timeline.Start(path, mark_cycles);
}

}  // namespace collectives
