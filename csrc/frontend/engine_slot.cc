#include "frontend/engine_slot.h"

#include <condition_variable>
#include <mutex>
#include <unordered_map>

namespace collectives {
namespace {

std::mutex g_mu;
std::condition_variable g_released;
Engine* g_engine = nullptr;
// Leases by engine: after shutdown() and init(), a kernel may still hold a lease on the old engine
// while the slot already holds the new one.
std::unordered_map<Engine*, int> g_leases;

}  // namespace

void SetSlotEngine(Engine* engine) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_engine = engine;
}

void ClearSlotEngine(Engine* engine) {
  std::unique_lock<std::mutex> lock(g_mu);
  if (g_engine == engine) g_engine = nullptr;
  // The engine was shut down first, so a leaseholder's wait has ended or ends soon.
  g_released.wait(lock, [engine] { return g_leases.find(engine) == g_leases.end(); });
}

EngineLease::EngineLease() {
  std::lock_guard<std::mutex> lock(g_mu);
  engine_ = g_engine;
  if (engine_ != nullptr) ++g_leases[engine_];
}

EngineLease::~EngineLease() {
  if (engine_ == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_leases.find(engine_);
  if (--it->second == 0) {
    g_leases.erase(it);
    g_released.notify_all();
  }
}

}  // namespace collectives
