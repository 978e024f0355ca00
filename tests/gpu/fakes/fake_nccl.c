/* A stand-in for NCCL (libnccl.so.2) for tests without a GPU: collectives on a communicator
 * of size 1 are copies (with the pre-multiplier of ncclRedOpCreatePreMulSum applied for
 * float32/float64), so the engine's NCCL path can be checked end to end. Communicators of
 * more ranks fail the way NCCL reports errors (return code + last error), unless
 * FAKE_NCCL_ANY_RANKS=1: then every rank's collectives act on its own data alone (the
 * results are not reductions; tests of control flow count launches instead).
 * Knobs (environment, read on each call):
 *   FAKE_NCCL_FAIL_ALLREDUCE=1   ncclAllReduce fails
 *   FAKE_NCCL_ASYNC_ERROR=1      ncclCommGetAsyncError reports a remote error
 *   FAKE_NCCL_FAIL_PREMUL=1      ncclRedOpCreatePreMulSum fails
 *   FAKE_NCCL_IN_PROGRESS=N      like a non-blocking communicator: ncclCommInitRank, the
 *                                collectives and ncclGroupEnd return ncclInProgress and the
 *                                communicator's state stays in progress for N polls
 *   FAKE_NCCL_GROUP_END_NEEDS_POLL=1  ncclGroupEnd returns only once another thread has
 *                                polled ncclCommGetAsyncError (fails after 3 s otherwise)
 * Counters for the tests: fake_nccl_count("allreduce"), ... */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int nranks, rank; } fake_comm;

static char last_error[256] = "";
static double premul[256];
static int next_op = 5; /* ncclNumOps: the first custom operator */
static int n_allreduce, n_premul_created, n_premul_destroyed, n_comm_destroyed, n_comm_aborted, n_comm_created,
    n_reducescatter, n_allgather, n_broadcast, n_group_end, n_in_progress_returned;
static volatile int n_async_polls;
static int in_progress_polls_left;

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

int fake_nccl_count(const char* what) {
  if (!strcmp(what, "allreduce")) return n_allreduce;
  if (!strcmp(what, "premul_created")) return n_premul_created;
  if (!strcmp(what, "premul_destroyed")) return n_premul_destroyed;
  if (!strcmp(what, "comm_created")) return n_comm_created;
  if (!strcmp(what, "comm_destroyed")) return n_comm_destroyed;
  if (!strcmp(what, "comm_aborted")) return n_comm_aborted;
  if (!strcmp(what, "reducescatter")) return n_reducescatter;
  if (!strcmp(what, "allgather")) return n_allgather;
  if (!strcmp(what, "broadcast")) return n_broadcast;
  if (!strcmp(what, "group_end")) return n_group_end;
  if (!strcmp(what, "in_progress_returned")) return n_in_progress_returned;
  if (!strcmp(what, "async_polls")) return n_async_polls;
  return -1;
}

/* The result of a call that succeeded: ncclInProgress when posing as non-blocking. */
static int done(void) {
  int polls = env_int("FAKE_NCCL_IN_PROGRESS", 0);
  if (polls <= 0) return 0;
  in_progress_polls_left = polls;
  ++n_in_progress_returned;
  return 7; /* ncclInProgress */
}

static size_t esize(int dt) {
  switch (dt) {
    case 0: case 1: return 1;
    case 2: case 3: case 7: return 4;
    case 4: case 5: case 8: return 8;
    default: return 2; /* float16, bfloat16 */
  }
}

int ncclGetVersion(int* v) { *v = 22304; return 0; }
int ncclGetUniqueId(ncclUniqueId* id) { memset(id->internal, 7, sizeof(id->internal)); return 0; }
int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks != 1 && !env_int("FAKE_NCCL_ANY_RANKS", 0)) {
    snprintf(last_error, sizeof(last_error), "fake NCCL supports one rank, not %d", nranks);
    return 5; /* ncclInvalidUsage */
  }
  for (int i = 0; i < 128; ++i)
    if (id.internal[i] != 7) { snprintf(last_error, sizeof(last_error), "unique id garbled"); return 4; }
  fake_comm* c = calloc(1, sizeof(fake_comm));
  c->nranks = nranks;
  c->rank = rank;
  *comm = c;
  ++n_comm_created;
  return done();
}
int ncclCommDestroy(void* c) { free(c); ++n_comm_destroyed; return 0; }
int ncclCommAbort(void* c) { free(c); ++n_comm_aborted; return 0; }
int ncclCommGetAsyncError(void* c, int* e) {
  (void)c;
  ++n_async_polls;
  if (in_progress_polls_left > 0) {
    --in_progress_polls_left;
    *e = 7;
    return 0;
  }
  *e = getenv("FAKE_NCCL_ASYNC_ERROR") ? 6 : 0;
  if (*e) snprintf(last_error, sizeof(last_error), "fake: peer vanished");
  return 0;
}
const char* ncclGetErrorString(int r) {
  switch (r) {
    case 0: return "no error";
    case 2: return "unhandled system error";
    case 3: return "internal error";
    case 4: return "invalid argument";
    case 5: return "invalid usage";
    case 6: return "remote process exited or there was a network error";
    case 7: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
const char* ncclGetLastError(void* c) { (void)c; return last_error; }

static int apply(void* recv, size_t count, int dt, int op) {
  if (op < 5) return 0; /* sum, prod, max, min, avg of one rank: the input */
  double f = premul[op & 255];
  if (dt == 7) { float* p = recv; for (size_t i = 0; i < count; ++i) p[i] = (float)(p[i] * f); return 0; }
  if (dt == 8) { double* p = recv; for (size_t i = 0; i < count; ++i) p[i] *= f; return 0; }
  snprintf(last_error, sizeof(last_error), "fake NCCL scales float32/float64 only");
  return 4;
}

int ncclAllReduce(const void* s, void* r, size_t n, int dt, int op, void* comm, void* st) {
  (void)comm; (void)st;
  if (getenv("FAKE_NCCL_FAIL_ALLREDUCE")) { snprintf(last_error, sizeof(last_error), "injected allreduce failure"); return 2; }
  ++n_allreduce;
  memmove(r, s, n * esize(dt));
  int e = apply(r, n, dt, op);
  return e ? e : done();
}
int ncclBroadcast(const void* s, void* r, size_t n, int dt, int root, void* comm, void* st) {
  (void)root; (void)st;
  ++n_broadcast;
  /* Several ranks (FAKE_NCCL_ANY_RANKS): only the root's own rows are its to copy. */
  if (((fake_comm*)comm)->nranks == 1 || root == ((fake_comm*)comm)->rank) memmove(r, s, n * esize(dt));
  return done();
}
int ncclReduce(const void* s, void* r, size_t n, int dt, int op, int root, void* comm, void* st) {
  (void)st;
  if (((fake_comm*)comm)->nranks == 1 || root == ((fake_comm*)comm)->rank) memmove(r, s, n * esize(dt));
  int e = apply(r, n, dt, op);
  return e ? e : done();
}
int ncclAllGather(const void* s, void* r, size_t n, int dt, void* comm, void* st) {
  (void)st;
  ++n_allgather;
  memmove((char*)r + (size_t)((fake_comm*)comm)->rank * n * esize(dt), s, n * esize(dt));
  return done();
}
int ncclReduceScatter(const void* s, void* r, size_t n, int dt, int op, void* comm, void* st) {
  (void)st;
  ++n_reducescatter;
  memmove(r, (const char*)s + (size_t)((fake_comm*)comm)->rank * n * esize(dt), n * esize(dt));
  int e = apply(r, n, dt, op);
  return e ? e : done();
}
int ncclSend(const void* s, size_t n, int dt, int peer, void* comm, void* st) {
  (void)s; (void)n; (void)dt; (void)peer; (void)st;
  if (((fake_comm*)comm)->nranks > 1) return 0;
  snprintf(last_error, sizeof(last_error), "fake NCCL has no peers");
  return 5;
}
int ncclRecv(void* r, size_t n, int dt, int peer, void* comm, void* st) {
  (void)r; (void)n; (void)dt; (void)peer; (void)st;
  if (((fake_comm*)comm)->nranks > 1) return 0;
  snprintf(last_error, sizeof(last_error), "fake NCCL has no peers");
  return 5;
}
int ncclGroupStart(void) { return 0; }
int ncclGroupEnd(void) {
  ++n_group_end;
  if (env_int("FAKE_NCCL_GROUP_END_NEEDS_POLL", 0)) {
    /* Like NCCL >= 2.22 connecting lazily inside ncclGroupEnd: it blocks for a while. Here
     * it blocks until another thread polls the communicator, which it can do only if the
     * caller did not hold a lock that thread needs. */
    const int before = n_async_polls;
    struct timespec pause = {0, 1000000};
    for (int i = 0; i < 3000 && n_async_polls == before; ++i) nanosleep(&pause, 0);
    if (n_async_polls == before) {
      snprintf(last_error, sizeof(last_error), "fake: nobody polled the communicator while ncclGroupEnd blocked");
      return 3; /* ncclInternalError */
    }
  }
  return done();
}
int ncclRedOpCreatePreMulSum(int* op, void* scalar, int dt, int residence, void* comm) {
  (void)comm;
  if (env_int("FAKE_NCCL_FAIL_PREMUL", 0)) { snprintf(last_error, sizeof(last_error), "injected PreMulSum failure"); return 2; }
  if (residence != 1) { snprintf(last_error, sizeof(last_error), "fake NCCL takes host scalars only"); return 4; }
  double f;
  if (dt == 7) f = *(float*)scalar;
  else if (dt == 8) f = *(double*)scalar;
  else f = 0.0; /* 16-bit scalars: apply() refuses those types anyway */
  *op = next_op++;
  premul[*op & 255] = f;
  ++n_premul_created;
  return 0;
}
int ncclRedOpDestroy(int op, void* comm) { (void)op; (void)comm; ++n_premul_destroyed; return 0; }
