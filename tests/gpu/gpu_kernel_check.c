/* The batched copy kernel's per-thread work (csrc/gpu/gpu_copy_batch.h), run on the CPU for every
 * block and thread of a grid, against memcpy and plain scaling: lengths 0..600 bytes, every
 * alignment of source and destination, 1..5 blocks per copy, up to 64 copies in a batch.
 * tests/gpu/test_gpu_kernels.py compiles and runs it. Exit 0 when every byte is right. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_copy_batch.h"

static unsigned char src_pool[64][640 + 16], dst_pool[64][640 + 16], want[64][640 + 16];

static void run(const CollectivesCopyBatch* b, unsigned blocks) {
  for (int copy = 0; copy < b->count; ++copy)
    for (unsigned block = 0; block < blocks; ++block)
      for (unsigned t = 0; t < COLLECTIVES_COPY_THREADS; ++t) collectives_copy_part(b, (unsigned)copy, block, blocks, t);
}

int main(void) {
  srand(12345);
  int failures = 0, batches = 0;
  for (int round = 0; round < 400; ++round) {
    CollectivesCopyBatch b;
    memset(&b, 0, sizeof(b));
    b.count = 1 + rand() % COLLECTIVES_COPY_BATCH;
    b.kind = round % 4 == 1 ? COLLECTIVES_COPY_FLOAT32 : round % 4 == 2 ? COLLECTIVES_COPY_FLOAT64 : COLLECTIVES_COPY_BYTES;
    b.scale = b.kind == COLLECTIVES_COPY_BYTES ? 1.0 : 0.25 * (1 + rand() % 8);
    const unsigned blocks = 1 + (unsigned)(rand() % 5);
    const int elem = b.kind == COLLECTIVES_COPY_FLOAT32 ? 4 : b.kind == COLLECTIVES_COPY_FLOAT64 ? 8 : 1;
    for (int k = 0; k < b.count; ++k) {
      /* Scaled copies keep the element alignment the fusion buffer keeps; plain ones any. */
      const int so = elem == 1 ? rand() % 16 : (rand() % (16 / elem)) * elem;
      const int dof = elem == 1 ? rand() % 16 : (rand() % (16 / elem)) * elem;
      const int n = (rand() % (600 / elem + 1)) * elem;
      for (int i = 0; i < 640 + 16; ++i) {
        src_pool[k][i] = (unsigned char)rand();
        dst_pool[k][i] = want[k][i] = (unsigned char)rand();
      }
      if (elem == 4)
        for (int i = 0; i < n / 4; ++i) {
          float v = (float)(rand() % 1000 - 500);
          memcpy(src_pool[k] + so + 4 * i, &v, 4);
          v = v * (float)b.scale;
          memcpy(want[k] + dof + 4 * i, &v, 4);
        }
      else if (elem == 8)
        for (int i = 0; i < n / 8; ++i) {
          double v = (double)(rand() % 1000 - 500);
          memcpy(src_pool[k] + so + 8 * i, &v, 8);
          v *= b.scale;
          memcpy(want[k] + dof + 8 * i, &v, 8);
        }
      else
        memcpy(want[k] + dof, src_pool[k] + so, (size_t)n);
      b.src[k] = (unsigned long long)(src_pool[k] + so);
      b.dst[k] = (unsigned long long)(dst_pool[k] + dof);
      b.bytes[k] = (unsigned long long)n;
    }
    run(&b, blocks);
    ++batches;
    for (int k = 0; k < b.count; ++k)
      if (memcmp(dst_pool[k], want[k], sizeof(want[k]))) {
        if (failures++ < 5)
          fprintf(stderr, "round %d copy %d: kind %d, %llu bytes, %u blocks: wrong bytes\n", round, k, b.kind,
                  b.bytes[k], blocks);
      }
  }
  printf("%d batches checked, %d wrong copies\n", batches, failures);
  return failures ? 1 : 0;
}
