#include "backends/mpi/mpi_fault.h"

#include <link.h>
#include <signal.h>
#include <sys/prctl.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace collectives {
namespace {

// The code segments of the MPI library and its transports, found once at install (the handler
// may not allocate or take locks).
struct CodeRange {
  uintptr_t begin = 0, end = 0, base = 0;
  char name[48] = {};
};
constexpr int kMaxRanges = 64;
CodeRange g_ranges[kMaxRanges];
int g_range_count = 0;
std::atomic<int> g_rank{-1};
struct sigaction g_previous_segv, g_previous_bus;

// Libraries whose crash is MPI's (basename prefixes): MPICH and Open MPI, UCX, libfabric.
const char* const kMpiLibraries[] = {"libmpi", "libpmpi", "libmpich", "libucp", "libuct", "libucs", "libucm",
                                     "libfabric", "libopen-pal", "libopen-rte", "libpmix"};

bool IsMpiLibrary(const char* path) {
  const char* slash = std::strrchr(path, '/');
  const char* base = slash ? slash + 1 : path;
  for (const char* prefix : kMpiLibraries)
    if (std::strncmp(base, prefix, std::strlen(prefix)) == 0) return true;
  return false;
}

int CollectRange(dl_phdr_info* info, size_t, void*) {
  if (info->dlpi_name == nullptr || !IsMpiLibrary(info->dlpi_name)) return 0;
  const char* slash = std::strrchr(info->dlpi_name, '/');
  for (int i = 0; i < info->dlpi_phnum && g_range_count < kMaxRanges; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
    CodeRange& r = g_ranges[g_range_count++];
    r.base = info->dlpi_addr;
    r.begin = info->dlpi_addr + ph.p_vaddr;
    r.end = r.begin + ph.p_memsz;
    std::strncpy(r.name, slash ? slash + 1 : info->dlpi_name, sizeof(r.name) - 1);
  }
  return 0;
}

uintptr_t FaultingPc(void* context) {
  const auto* uc = static_cast<const ucontext_t*>(context);
#if defined(__x86_64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;  // unknown here: every fault goes to the previous handler
#endif
}

// Async-signal-safe formatting into a fixed buffer.
struct Line {
  char text[640];
  size_t n = 0;
  void Add(const char* s) {
    while (*s && n < sizeof(text) - 1) text[n++] = *s++;
  }
  void Decimal(long v) {
    char digits[24];
    int k = 0;
    const bool negative = v < 0;
    unsigned long u = negative ? 0UL - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
    do digits[k++] = static_cast<char>('0' + u % 10); while ((u /= 10) && k < 23);
    if (negative) Add("-");
    while (k > 0 && n < sizeof(text) - 1) text[n++] = digits[--k];
  }
  void Hex(uintptr_t v) {
    char digits[20];
    int k = 0;
    do digits[k++] = "0123456789abcdef"[v & 15]; while ((v >>= 4) && k < 19);
    Add("0x");
    while (k > 0 && n < sizeof(text) - 1) text[n++] = digits[--k];
  }
};

void OnFault(int sig, siginfo_t* info, void* context) {
  const uintptr_t pc = FaultingPc(context);
  const CodeRange* in = nullptr;
  // A fault of the code itself (not a SIGSEGV someone sent with kill, whose pc is wherever the
  // thread happened to be, often polling inside MPI).
  const bool synchronous = info != nullptr && info->si_code > 0;
  for (int i = 0; i < g_range_count && pc != 0 && synchronous; ++i)
    if (pc >= g_ranges[i].begin && pc < g_ranges[i].end) in = &g_ranges[i];
  if (in == nullptr) {
    // Not MPI's: the handler that was there before takes the fault when the instruction repeats.
    sigaction(sig, sig == SIGBUS ? &g_previous_bus : &g_previous_segv, nullptr);
    return;
  }
  char thread[17] = {};
  prctl(PR_GET_NAME, thread, 0, 0, 0);
  Line line;
  line.Add("[collectives FATAL rank ");
  line.Decimal(g_rank.load(std::memory_order_relaxed));
  line.Add("] crashed inside the MPI library (");
  line.Add(sig == SIGBUS ? "SIGBUS" : "SIGSEGV");
  line.Add(" at ");
  line.Add(in->name);
  line.Add("+");
  line.Hex(pc - in->base);
  line.Add(", address ");
  line.Hex(reinterpret_cast<uintptr_t>(info->si_addr));
  line.Add(", thread ");
  line.Add(thread);
  line.Add("). MPICH does this when a send to a peer whose connection failed fails (its host crashed "
           "or lost its link, or its process was killed): look for the lost host in the launcher's and "
           "the other ranks' messages. This process exits with status ");
  line.Decimal(kMpiCrashExitCode);
  line.Add("\n");
  size_t done = 0;
  while (done < line.n) {
    const ssize_t w = write(STDERR_FILENO, line.text + done, line.n - done);
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
  _exit(kMpiCrashExitCode);
}

}  // namespace

void ReportCrashesInMpi(int rank) {
  g_rank.store(rank, std::memory_order_relaxed);
  static std::once_flag installed;
  std::call_once(installed, [] {
    dl_iterate_phdr(&CollectRange, nullptr);
    if (g_range_count == 0) return;  // no MPI library by a name we know: leave the signals alone
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = &OnFault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous_segv);
    sigaction(SIGBUS, &sa, &g_previous_bus);
  });
}

}  // namespace collectives
