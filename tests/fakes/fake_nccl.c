/* A stand-in for NCCL (libnccl.so.2) of one rank, for tests without a GPU: collectives on a
 * communicator of size 1 are copies (with the pre-multiplier of ncclRedOpCreatePreMulSum
 * applied for float32/float64), so the engine's NCCL path can be checked end to end.
 * Communicators of more ranks fail the way NCCL reports errors (return code + last error).
 * Knobs (environment): FAKE_NCCL_FAIL_ALLREDUCE=1 makes ncclAllReduce fail;
 * FAKE_NCCL_ASYNC_ERROR=1 makes ncclCommGetAsyncError report a remote error.
 * Counters for the tests: fake_nccl_count("allreduce"), ... */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int nranks, rank; } fake_comm;

static char last_error[256] = "";
static double premul[256];
static int next_op = 5; /* ncclNumOps: the first custom operator */
static int n_allreduce, n_premul_created, n_premul_destroyed, n_comm_destroyed, n_comm_aborted, n_comm_created,
    n_reducescatter, n_allgather, n_broadcast;

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
  return -1;
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
  if (nranks != 1) {
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
  return 0;
}
int ncclCommDestroy(void* c) { free(c); ++n_comm_destroyed; return 0; }
int ncclCommAbort(void* c) { free(c); ++n_comm_aborted; return 0; }
int ncclCommGetAsyncError(void* c, int* e) {
  (void)c;
  *e = getenv("FAKE_NCCL_ASYNC_ERROR") ? 6 : 0;
  if (*e) snprintf(last_error, sizeof(last_error), "fake: peer vanished");
  return 0;
}
const char* ncclGetErrorString(int r) {
  switch (r) {
    case 0: return "no error";
    case 2: return "unhandled system error";
    case 4: return "invalid argument";
    case 5: return "invalid usage";
    case 6: return "remote process exited or there was a network error";
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
  return apply(r, n, dt, op);
}
int ncclBroadcast(const void* s, void* r, size_t n, int dt, int root, void* comm, void* st) {
  (void)root; (void)comm; (void)st;
  ++n_broadcast;
  memmove(r, s, n * esize(dt));
  return 0;
}
int ncclReduce(const void* s, void* r, size_t n, int dt, int op, int root, void* comm, void* st) {
  (void)root; (void)comm; (void)st;
  memmove(r, s, n * esize(dt));
  return apply(r, n, dt, op);
}
int ncclAllGather(const void* s, void* r, size_t n, int dt, void* comm, void* st) {
  (void)comm; (void)st;
  ++n_allgather;
  memmove(r, s, n * esize(dt));
  return 0;
}
int ncclReduceScatter(const void* s, void* r, size_t n, int dt, int op, void* comm, void* st) {
  (void)comm; (void)st;
  ++n_reducescatter;
  memmove(r, s, n * esize(dt));
  return apply(r, n, dt, op);
}
int ncclSend(const void* s, size_t n, int dt, int peer, void* comm, void* st) {
  (void)s; (void)n; (void)dt; (void)peer; (void)comm; (void)st;
  snprintf(last_error, sizeof(last_error), "fake NCCL has no peers");
  return 5;
}
int ncclRecv(void* r, size_t n, int dt, int peer, void* comm, void* st) {
  (void)r; (void)n; (void)dt; (void)peer; (void)comm; (void)st;
  snprintf(last_error, sizeof(last_error), "fake NCCL has no peers");
  return 5;
}
int ncclGroupStart(void) { return 0; }
int ncclGroupEnd(void) { return 0; }
int ncclRedOpCreatePreMulSum(int* op, void* scalar, int dt, int residence, void* comm) {
  (void)comm;
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
