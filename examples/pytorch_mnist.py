"""Horovod's PyTorch MNIST recipe on collectives, with MNIST-shaped synthetic data (no download).

    .venv/bin/mpirun -np 2 .venv/bin/python examples/pytorch_mnist.py [--epochs 3] [--cuda]

Each 28x28 image is noise plus a bright 7x7 patch whose position (one of 10 cells) is the
label, so a small CNN learns it in a few epochs. The recipe: init, one torch thread per rank,
shard the data by rank, scale the learning rate by the number of ranks, broadcast the initial
parameters and optimizer state from rank 0, wrap the optimizer in DistributedOptimizer, and
average the metrics over ranks with allreduce. With --cuda each rank trains on the GPU of its
local rank (examples/slurm/train_gpu.sbatch).
"""
import argparse
import time

import torch
import torch.nn.functional as F

import collectives.torch as hvd


def synthetic_mnist(n, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = 0.3 * torch.randn(n, 1, 28, 28, generator=g)
    for c in range(10):
        row, col = divmod(c, 5)
        r0, c0 = 3 + row * 14, 1 + col * 5
        images[labels == c, :, r0:r0 + 7, c0:c0 + 5] += 1.0
    return images, labels


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, kernel_size=5)
        self.conv2 = torch.nn.Conv2d(8, 16, kernel_size=5)
        self.fc1 = torch.nn.Linear(256, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def metric_average(value, name):
    return float(hvd.allreduce(torch.tensor(value, dtype=torch.float32), name=name))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--train-size", type=int, default=4096)
    parser.add_argument("--cuda", action="store_true", help="train on GPU number local_rank of each host")
    args = parser.parse_args()

    hvd.init()
    torch.set_num_threads(1)  # one compute thread per rank: ranks share the machine's cores
    torch.manual_seed(42 + hvd.rank())  # different on purpose: broadcast_parameters fixes it

    images, labels = synthetic_mnist(args.train_size, seed=0)
    test_images, test_labels = synthetic_mnist(1024, seed=1)
    # Each rank trains on its own shard (what DistributedSampler does).
    images, labels = images[hvd.rank()::hvd.size()], labels[hvd.rank()::hvd.size()]
    test_images, test_labels = test_images[hvd.rank()::hvd.size()], test_labels[hvd.rank()::hvd.size()]

    device = torch.device("cpu")
    if args.cuda:
        device = torch.device("cuda", hvd.local_rank())  # one rank per GPU of its host
        torch.cuda.set_device(device)
        images, labels = images.to(device), labels.to(device)
        test_images, test_labels = test_images.to(device), test_labels.to(device)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        perm = torch.randperm(len(images), generator=torch.Generator().manual_seed(epoch))
        total, batches = 0.0, 0
        for i in range(0, len(images) - args.batch_size + 1, args.batch_size):
            idx = perm[i:i + args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images[idx]), labels[idx])
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        train_loss = metric_average(total / batches, "avg_train_loss")

        model.eval()
        with torch.no_grad():
            logits = model(test_images)
            test_loss = F.cross_entropy(logits, test_labels).item()
            accuracy = (logits.argmax(1) == test_labels).float().mean().item()
        test_loss = metric_average(test_loss, "avg_test_loss")
        accuracy = metric_average(accuracy, "avg_accuracy")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: train loss {train_loss:.4f}  test loss {test_loss:.4f}  "
                  f"accuracy {100 * accuracy:.1f}%  ({time.perf_counter() - start:.1f} s, {hvd.size()} ranks)",
                  flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
