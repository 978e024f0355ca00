"""PyTorch training on Ray with collectives.ray.RayExecutor (Horovod's RayExecutor API).

    python examples/ray/pytorch_ray.py --num-workers 2             # a local Ray on this machine
    python examples/ray/pytorch_ray.py --address auto --num-hosts 2 --workers-per-host 2   # a cluster
    python examples/ray/pytorch_ray.py --elastic --min-workers 2 --max-workers 4 --address auto

Synthetic regression data (no download); every rank trains on its share, gradients averaged
by the engine. With --elastic the training commits its state every step and survives losing
workers or nodes (ElasticRayExecutor restarts it from the last commit).
"""
import argparse

import ray

from collectives.ray import ElasticRayExecutor, RayExecutor


def train(steps, lr):
    import torch
    import collectives.torch as hvd
    hvd.init()  # the rank's engine is started already: a no-op, kept as in Horovod scripts
    torch.manual_seed(0)
    x = torch.randn(64 * hvd.size(), 8)
    y = x @ torch.arange(8.0).unsqueeze(1)
    mine = slice(hvd.rank() * 64, (hvd.rank() + 1) * 64)
    model = torch.nn.Linear(8, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
        loss.backward()
        opt.step()
    return hvd.rank(), loss.item()


def train_elastic(steps, lr):
    import torch
    import collectives.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    x = torch.randn(240, 8)
    y = x @ torch.arange(8.0).unsqueeze(1)
    model = torch.nn.Linear(8, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)

    @hvd.elastic.run
    def loop(state):
        share = len(x) // hvd.size()
        mine = slice(hvd.rank() * share, (hvd.rank() + 1) * share)  # the size may change at a restart
        loss = torch.tensor(float("nan"))
        while state.step < steps:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
            loss.backward()
            opt.step()
            state.step += 1
            state.commit()
        return loss.item()

    return hvd.rank(), loop(state)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--address", default=None, help="a Ray cluster's address ('auto': the one this machine is in)")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--num-hosts", type=int)
    p.add_argument("--workers-per-host", type=int)
    p.add_argument("--elastic", action="store_true")
    p.add_argument("--min-workers", type=int, default=1)
    p.add_argument("--max-workers", type=int)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.01)
    a = p.parse_args()
    ray.init(address=a.address)
    if a.elastic:
        executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(timeout_s=120), min_workers=a.min_workers,
                                      max_workers=a.max_workers)
        executor.start()
        print(executor.run(train_elastic, args=[a.steps, a.lr]))
        executor.shutdown()
        return
    shape = {"num_hosts": a.num_hosts, "num_workers_per_host": a.workers_per_host} if a.num_hosts else \
        {"num_workers": a.num_workers}
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), **shape)
    executor.start()
    try:
        for rank, loss in executor.run(train, args=[a.steps, a.lr]):
            print(f"rank {rank}: final loss {loss:.6f}")
    finally:
        executor.shutdown()


if __name__ == "__main__":
    main()
