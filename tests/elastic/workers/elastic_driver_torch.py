"""Horovod-style elastic torch training under the elastic driver (tests/elastic/test_elastic_driver.py).

A tiny linear model on N synthetic samples, ``hvd.elastic.TorchState`` with an
``ElasticSampler``, a commit every COMMIT_EVERY batches. The state also carries, per sample, how
many times a committed step used it (the step's indices are allgathered), so the end can check
that every sample was used exactly once per epoch across every restart and resize, i.e. the same
samples as an uninterrupted run. With 6 samples per rank per batch, the samples left at any
commit divide evenly over 2 or 3 ranks, so the sampler never pads.

Each rank prints ``RESULT {json}`` at the end: its weights, and the sample counts. Progress lines
(``[gen G rank R/S] ...``) go to stderr.

--die-rank R --die-generation G [G ...] --die-step S: rank R SIGKILLs itself at its S-th step
(counted from the start of generation G) in each generation G. --step-sleep: seconds per step
(time for the test to change the hosts). --zero-stage Z: DistributedOptimizer(zero_stage=Z), the
optimizer state sharded over the ranks (tests/elastic/test_elastic_zero.py).
"""
import argparse
import json
import os
import signal
import sys
import time

import torch

import collectives.torch as hvd

N = 72
BATCH = 6
EPOCHS = 2
COMMIT_EVERY = 2
FEATURES = 4


def log(text):
    print(f"[gen {os.environ.get('COLLECTIVES_ELASTIC_GENERATION', '-')} rank {hvd.rank()}/{hvd.size()}] {text}",
          file=sys.stderr, flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--die-generation", type=int, nargs="+", default=[0])
    p.add_argument("--die-step", type=int, default=-1)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--zero-stage", type=int, default=0)
    a = p.parse_args()
    generation = int(os.environ.get("COLLECTIVES_ELASTIC_GENERATION", "0"))

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N, FEATURES, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(N, 1, generator=g)
    index = torch.arange(N)
    dataset = torch.utils.data.TensorDataset(x, y, index)

    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.5)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), zero_stage=a.zero_stage)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, batch=0,
                                   counts=[0] * N, steps=0)

    def rescale_lr():
        for group in optimizer.param_groups:
            group["lr"] = 0.05 * hvd.size()
        sampler.reset()
    state.register_reset_callbacks([rescale_lr])

    @hvd.elastic.run
    def train(state):
        log(f"start: commit {state.commit_id}, epoch {state.epoch}, batch {state.batch}, "
            f"samples done {sum(state.counts)}")
        steps_here = 0
        for state.epoch in range(state.epoch, a.epochs):
            for state.batch, (xb, yb, ib) in enumerate(loader):
                if generation in a.die_generation and hvd.rank() == a.die_rank and steps_here == a.die_step:
                    log("killing myself with SIGKILL")
                    os.kill(os.getpid(), signal.SIGKILL)
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(xb), yb).backward()
                optimizer.step()
                for i in hvd.allgather(ib, name="batch.indices").tolist():
                    state.counts[i] += 1
                sampler.record_batch(state.batch, BATCH)
                state.steps += 1
                steps_here += 1
                time.sleep(a.step_sleep)
                if state.batch % COMMIT_EVERY == COMMIT_EVERY - 1:
                    state.commit()
            state.batch = 0
            sampler.set_epoch(state.epoch + 1)
            state.epoch += 1
            state.commit()
        return model

    train(state)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
    print("RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "generation": generation,
                                  "weights": weights.tolist(), "counts": state.counts,
                                  "commit": state.commit_id}), flush=True)


if __name__ == "__main__":
    main()
