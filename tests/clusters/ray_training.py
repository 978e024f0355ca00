"""The training functions the Ray tests run on every rank, and their numpy references: a linear
model fitted by SGD on the mean squared error, each rank on its equal share of every batch,
gradients averaged by the engine; so every step equals one full-batch numpy step."""
import numpy as np

FEATURES, OUTPUTS, ROWS, LR = 6, 2, 32, 0.1


def data(seed=0, rows=ROWS):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES))
    y = np.tanh(x @ rng.normal(size=(FEATURES, OUTPUTS)))
    w = rng.normal(size=(OUTPUTS, FEATURES)) * 0.3
    b = rng.normal(size=(OUTPUTS,)) * 0.1
    return x, y, w, b


def numpy_reference(steps, seed=0, rows=ROWS):
    """Full-batch SGD in float64: (w, b) after ``steps`` steps."""
    x, y, w, b = data(seed, rows)
    for _ in range(steps):
        grad = 2.0 * (x @ w.T + b - y) / y.size  # d(mean squared error)/d(prediction)
        w, b = w - LR * grad.T @ x, b - LR * grad.sum(0)
    return w, b


def my_rows(a, rank, size):
    return a[rank * (len(a) // size):(rank + 1) * (len(a) // size)]


def torch_train(steps, seed=0):
    """torch's DistributedOptimizer over the ranks (float64); returns (w, b, rank, size)."""
    import torch
    import collectives.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    x, y, w, b = data(seed)
    x, y = (torch.from_numpy(my_rows(a, hvd.rank(), hvd.size())) for a in (x, y))
    model = torch.nn.Linear(FEATURES, OUTPUTS).double()
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(w))
        model.bias.copy_(torch.from_numpy(b))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model.weight.detach().numpy().copy(), model.bias.detach().numpy().copy(), hvd.rank(), hvd.size()


def keras_train(steps, seed=0):
    """Keras 3's fit with collectives.keras' DistributedOptimizer (float32); (w, b, rank, size)."""
    import keras
    import collectives.keras as hvd
    hvd.init()
    x, y, w, b = data(seed)
    share = len(x) // hvd.size()
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(OUTPUTS)])
    model.layers[0].set_weights([w.T.astype(np.float32), b.astype(np.float32)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    mine = (my_rows(x, hvd.rank(), hvd.size()), my_rows(y, hvd.rank(), hvd.size()))
    xs, ys = (np.concatenate([a] * steps).astype(np.float32) for a in mine)  # one batch per step
    model.fit(xs, ys, batch_size=share, epochs=1, shuffle=False, verbose=0)
    kernel, bias = model.layers[0].get_weights()
    return kernel.T, bias, hvd.rank(), hvd.size()


ELASTIC_ROWS = 24  # divides evenly over 1, 2, 3 or 4 ranks: every step is one full-batch step


def torch_elastic_train(steps, step_sleep, seed=0):
    """hvd.elastic.run over TorchState, a commit after every step. Returns (w, b, rank, size,
    generation, the step this generation started from, local_rank, cross_rank, cross_size)."""
    import os
    import time
    import torch
    import collectives.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    x, y, w, b = data(seed, ELASTIC_ROWS)
    model = torch.nn.Linear(FEATURES, OUTPUTS).double()
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(w))
        model.bias.copy_(torch.from_numpy(b))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    started = []

    @hvd.elastic.run
    def train(state):
        started.append(state.step)
        xs, ys = (torch.from_numpy(my_rows(a, hvd.rank(), hvd.size())) for a in (x, y))
        while state.step < steps:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xs), ys).backward()
            opt.step()
            state.step += 1
            state.commit()
            time.sleep(step_sleep)

    train(state)
    generation = int(os.environ.get("COLLECTIVES_ELASTIC_GENERATION", "-1"))
    return (model.weight.detach().numpy().copy(), model.bias.detach().numpy().copy(), hvd.rank(), hvd.size(),
            generation, started[0], hvd.local_rank(), hvd.cross_rank(), hvd.cross_size())
