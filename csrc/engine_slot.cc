#include "engine_slot.h"

#include <condition_variable>
#include <mutex>

namespace collectives {
namespace {

std::mutex g_mu;
std::condition_variable g_released;
Engine* g_engine = nullptr;
int g_leases = 0;

}  // namespace

void SetSlotEngine(Engine* engine) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_engine = engine;
}

void ClearSlotEngine(Engine* engine) {
  std::unique_lock<std::mutex> lock(g_mu);
  if (g_engine != engine) return;
  g_engine = nullptr;
  // The engine was shut down first, so a leaseholder's wait has ended or ends soon.
  g_released.wait(lock, [] { return g_leases == 0; });
}

EngineLease::EngineLease() {
  std::lock_guard<std::mutex> lock(g_mu);
  engine_ = g_engine;
  if (engine_ != nullptr) ++g_leases;
}

EngineLease::~EngineLease() {
  if (engine_ == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_leases == 0) g_released.notify_all();
}

}  // namespace collectives
