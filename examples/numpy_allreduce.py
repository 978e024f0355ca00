"""A first tour of collectives on numpy arrays.

Run with:  mpirun -np 2 python examples/numpy_allreduce.py   (any N >= 1 works)
"""
import numpy as np

import collectives as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()


def say(*args):
    if rank == 0:
        print(*args, flush=True)


say(f"running on {size} ranks")

# allreduce: every rank contributes [rank, rank, rank]; Sum and Average come back everywhere.
x = np.full(3, float(rank))
say("allreduce Sum     :", hvd.allreduce(x, op=hvd.Sum, name="x.sum"))          # 0+1+...+(N-1)
say("allreduce Average :", hvd.allreduce(x, op=hvd.Average, name="x.avg"))      # (N-1)/2

# broadcast: rank 0's array replaces everyone's (the usual way to start from equal weights).
w = np.arange(4.0) * (rank + 1)
w = hvd.broadcast(w, root_rank=0, name="w.init")
say("broadcast from 0  :", w)

# allgather: rank r contributes r+1 rows; the results are concatenated along the first axis.
rows = np.full((rank + 1, 2), rank, dtype=np.int32)
gathered = hvd.allgather(rows, name="rows")
say(f"allgather rows    : shape {gathered.shape}, first column {gathered[:, 0].tolist()}")

# Data-parallel linear regression: each rank holds its own shard of the data, computes the
# gradient on it, and the ranks average their gradients with allreduce before each step.
true_w = np.array([2.0, -3.0, 0.5])
rng = np.random.default_rng(seed=rank)              # a different shard on every rank
X = rng.normal(size=(256, 3))
y = X @ true_w + 0.1 * rng.normal(size=256)

weights = hvd.broadcast(np.random.default_rng().normal(size=3), root_rank=0, name="weights.init")
lr = 0.1
for step in range(50):
    err = X @ weights - y
    grad = 2.0 * X.T @ err / len(y)
    grad = hvd.allreduce(grad, op=hvd.Average, name="grad")   # same name each step: cached
    weights -= lr * grad
    loss = hvd.allreduce(np.array([np.mean(err ** 2)]), op=hvd.Average, name="loss")[0]
    if step % 10 == 0 or step == 49:
        say(f"step {step:2d}  loss {loss:.5f}")

say("learned weights   :", np.round(weights, 3), " (true:", true_w, ")")

# Every rank applied the same averaged gradients, so every rank holds the same weights.
everyone = hvd.allgather(weights[None, :], name="weights.final")
identical = all(np.array_equal(everyone[0], row) for row in everyone)
say("identical on all ranks:", identical)

hvd.shutdown()
raise SystemExit(0 if identical else 1)
