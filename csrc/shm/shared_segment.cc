#include "shm/shared_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>

namespace collectives {
namespace {
constexpr int kNameBytes = 64;
}  // namespace

Status MapSharedSegment(MPI_Comm comm, size_t bytes, const char* what, void** mapped, std::string* why) {
  *mapped = nullptr;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  char name[kNameBytes] = {0};
  int fd = -1;
  if (rank == 0) {
    static std::atomic<unsigned> serial{0};
    std::snprintf(name, sizeof(name), "/collectives-%s-%d-%u", what, static_cast<int>(getpid()), serial++);
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    // A segment left shorter than `bytes` would still map, and touching it would SIGBUS: give it
    // up here, so that the agreement below turns it off on every rank.
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      close(fd);
      fd = -1;
    }
  }
  if (MPI_Bcast(name, kNameBytes, MPI_CHAR, 0, comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, std::string("MPI_Bcast of the name of the shared-memory segment for ") +
                                                   what + " failed");
  if (rank != 0 && name[0]) fd = shm_open(name, O_RDWR, 0600);
  void* m = MAP_FAILED;
  if (fd >= 0) {
    m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  int mine = m != MAP_FAILED ? 1 : 0, everyone = 0;
  if (MPI_Allreduce(&mine, &everyone, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS)
    return Status::Error(StatusCode::INTERNAL, std::string("MPI_Allreduce agreeing on the shared-memory segment for ") +
                                                   what + " failed");
  if (rank == 0 && name[0]) shm_unlink(name);
  if (!everyone) {
    if (m != MAP_FAILED) munmap(m, bytes);
    *why = "a rank could not map a shared-memory segment of " + std::to_string(bytes) + " bytes";
    return Status::Ok();
  }
  *mapped = m;
  return Status::Ok();
}

Status MapJobSegment(MPI_Comm comm, int local_size, bool enabled, const char* knob, size_t bytes, const char* what,
                     void** mapped, std::vector<pid_t>* pids, std::string* blocker) {
  *mapped = nullptr;
  int size = 0;
  MPI_Comm_size(comm, &size);
  if (!enabled) {
    *blocker = std::string("turned off (") + knob + "=0)";
    return Status::Ok();
  }
  if (size < 2) {
    *blocker = "one rank";
    return Status::Ok();
  }
  if (local_size != size) {
    *blocker = "the ranks are on several hosts";
    return Status::Ok();
  }
  Status st = MapSharedSegment(comm, bytes, what, mapped, blocker);
  if (!st.ok() || *mapped == nullptr) return st;
  const int me = static_cast<int>(getpid());
  std::vector<int> all(static_cast<size_t>(size), 0);
  if (MPI_Allgather(&me, 1, MPI_INT, all.data(), 1, MPI_INT, comm) != MPI_SUCCESS) {
    munmap(*mapped, bytes);
    *mapped = nullptr;
    return Status::Error(StatusCode::INTERNAL, "MPI_Allgather of the ranks' process ids failed");
  }
  pids->assign(all.begin(), all.end());
  blocker->clear();
  return Status::Ok();
}

bool ProcessGone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  // Exited but not yet reaped by its launcher: a zombie (or dead) in /proc.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

}  // namespace collectives
