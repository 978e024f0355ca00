"""A PyTorch model and a Keras model trained side by side in the same processes.

    collectivesrun -np 2 python examples/mixed_torch_tf.py [--steps 30] [--check]

Each rank takes its slice of every batch; one ``hvd.DistributedOptimizer`` call wraps the
torch optimizer and one wraps the Keras optimizer, and both average their gradients through
the same engine (the same negotiation, the same fusion buffer). Both loss curves are printed,
averaged over the ranks. With ``--check`` every rank also trains the two models as a single
process would on the whole batches, and reports whether the distributed models match.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

import collectives as hvd  # noqa: E402

hvd.init()  # first: it sizes torch's and TensorFlow's thread pools (cores / ranks)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402

FEATURES, HIDDEN, PER_RANK = 8, 16, 16
TRUE_W = np.linspace(-1.0, 1.0, FEATURES).astype(np.float32)


def batch(step):
    """The whole batch of a step, the same on every rank (each rank then takes its slice)."""
    rng = np.random.default_rng(step)
    x = rng.standard_normal((PER_RANK * hvd.size(), FEATURES)).astype(np.float32)
    y = (np.tanh(x @ TRUE_W) + 0.1 * rng.standard_normal(len(x))).astype(np.float32)[:, None]
    return x, y


def torch_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))


def keras_model():
    keras.utils.set_random_seed(hvd.rank())  # different on every rank: the broadcast fixes that
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="tanh"),
                             keras.layers.Dense(1)])


def torch_step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    opt.step()
    return loss.item()


def keras_step(model, opt, x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return float(loss)


def max_relative_difference(a, b):
    return max(float(np.max(np.abs(p - q) / (np.abs(q) + 1e-6))) for p, q in zip(a, b))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--check", action="store_true", help="compare with single-process training")
    args = parser.parse_args()
    rank, size = hvd.rank(), hvd.size()

    tmodel, kmodel = torch_model(), keras_model()
    hvd.broadcast_parameters(tmodel.state_dict(), root_rank=0)
    hvd.broadcast_variables(kmodel.variables, root_rank=0)
    if args.check:  # single-process twins, from the same starting point
        tref, kref = torch_model(), keras.models.clone_model(kmodel)
        tref.load_state_dict(tmodel.state_dict())
        kref.set_weights(kmodel.get_weights())
        tref_opt = torch.optim.SGD(tref.parameters(), lr=args.lr)
        kref_opt = keras.optimizers.SGD(learning_rate=args.lr)

    topt = hvd.DistributedOptimizer(torch.optim.SGD(tmodel.parameters(), lr=args.lr),
                                    named_parameters=tmodel.named_parameters())
    kopt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=args.lr))
    if rank == 0:
        print(f"training a torch and a Keras model on {size} ranks, {PER_RANK} rows per rank per step")

    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for step in range(args.steps):
        x, y = batch(step)
        losses = np.array([torch_step(tmodel, topt, x[mine], y[mine]), keras_step(kmodel, kopt, x[mine], y[mine])])
        losses = hvd.allreduce(losses, name="losses")  # averaged over the ranks
        if args.check:
            torch_step(tref, tref_opt, x, y)
            keras_step(kref, kref_opt, x, y)
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  torch loss {losses[0]:.4f}  keras loss {losses[1]:.4f}", flush=True)

    if args.check:
        tdiff = max_relative_difference([p.detach().numpy() for p in tmodel.parameters()],
                                        [p.detach().numpy() for p in tref.parameters()])
        kdiff = max_relative_difference(kmodel.get_weights(), kref.get_weights())
        ok = hvd.allgather_object((tdiff < 1e-4, kdiff < 1e-4))
        if rank == 0:
            print(f"torch model matches single-process training: {all(t for t, _ in ok)} "
                  f"(max relative difference {tdiff:.2e})")
            print(f"keras model matches single-process training: {all(k for _, k in ok)} "
                  f"(max relative difference {kdiff:.2e})")


if __name__ == "__main__":
    main()
