// The futex system call on a 32-bit word that may lie in memory shared by several processes
// (so never FUTEX_PRIVATE): the doorbell (doorbell.h) and the shared-memory exchange
// (shared_exchange.h) sleep on such words.
#pragma once
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <ctime>

namespace collectives {

inline long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout, uint32_t mask) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex word");
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, mask);
}

}  // namespace collectives
