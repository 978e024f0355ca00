"""Elastic API on real ranks (tests/elastic/test_elastic_api.py). Usage: elastic_api_worker.py MODE REPORT_DIR

Modes:
  torch_api   plain mpirun: State/ObjectState/TorchState commit, restore, sync, reset callbacks,
              check_host_updates; ElasticSampler partitions; a Horovod-style elastic torch job
              run as a fixed-size job, against a one-process replay of the same global batches.
  keras_api   plain mpirun: KerasState commit/restore/sync; a Horovod-style elastic Keras job
              (model.fit with the elastic callbacks) against one process on the whole batches.
  restart     the torch job under COLLECTIVES_ELASTIC=1 (the test plays the driver): it runs,
              commits every step and is stopped by the driver's new host version (exit 77), or,
              in a later generation, restores the newest commit and finishes.
  peer_kill HOW  COLLECTIVES_ELASTIC=1: rank 1 leaves after commit 2 (HOW: "sigkill" itself, or
              "exit" with status 0 from inside the training function); the others are in a
              collective when it goes.
  direct_check COLLECTIVES_ELASTIC=1, no framework: an ObjectState job whose own
              check_host_updates() (not a commit) meets the new host version.

Events go to REPORT_DIR/<mode>.g<generation>.rank<r>.jsonl, one JSON object a line, flushed as
they happen (a rank may end by os._exit or a signal); the Checker summary goes to stdout.
"""
import json
import os
import random
import signal
import sys

import numpy as np

from common import Checker

MODE, REPORT_DIR = sys.argv[1], sys.argv[2]
GENERATION = int(os.environ.get("COLLECTIVES_ELASTIC_GENERATION", "0"))

N_SAMPLES, PER_RANK_BATCH, EPOCHS, SAMPLER_SEED = 48, 2, 2, 7
LR, MOMENTUM = 0.05, 0.9


class Report:
    def __init__(self, rank):
        path = os.path.join(REPORT_DIR, f"{MODE}.g{GENERATION}.rank{rank}.jsonl")
        self.file = open(path, "a", buffering=1)

    def __call__(self, event, **fields):
        self.file.write(json.dumps(dict(event=event, **fields)) + "\n")
        self.file.flush()


# ------------------------------------------------------------------------------------ torch job

def torch_data():
    import torch

    g = torch.Generator().manual_seed(1)
    x = torch.randn(N_SAMPLES, 4, dtype=torch.float64, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64) + 0.1 * torch.randn(
        N_SAMPLES, 1, dtype=torch.float64, generator=g)
    return x, y


def initial_model(seed):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Linear(4, 1).double()


def build_torch_job(hvd, report):
    """The Horovod elastic recipe: each rank starts from different weights (sync gives rank 0's)."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    x, y = torch_data()

    class Indexed(Dataset):
        def __len__(self):
            return N_SAMPLES

        def __getitem__(self, i):
            return i, x[i], y[i]

    model = initial_model(100 + hvd.rank())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(Indexed(), shuffle=True, seed=SAMPLER_SEED)
    loader = DataLoader(Indexed(), batch_size=PER_RANK_BATCH, sampler=sampler)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0)
    state.register_reset_callbacks([lambda: report("reset_callback", size=hvd.size(), commit=state.commit_id)])

    @hvd.elastic.run
    def train(state):
        report("start", commit=state.commit_id, epoch=state.epoch, size=hvd.size(),
               processed=sorted(sampler.processed_indices), weights=weights_of(model))
        for state.epoch in range(state.epoch, EPOCHS):
            for batch_idx, (idx, xb, yb) in enumerate(loader):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(xb), yb).backward()
                opt.step()
                sampler.record_batch(batch_idx, PER_RANK_BATCH)
                report("batch", epoch=state.epoch, indices=idx.tolist(), commit=state.commit_id + 1)
                if MODE == "peer_kill" and GENERATION == 0 and hvd.rank() == 1 and state.commit_id == 2:
                    if sys.argv[3] == "sigkill":
                        report("killing_myself")
                        os.kill(os.getpid(), signal.SIGKILL)
                    report("exiting")
                    sys.exit(0)  # a clean exit: the engine tells the others this rank is gone
                state.commit()
            sampler.set_epoch(state.epoch + 1)
        return weights_of(model)

    return state, train


def weights_of(model):
    return [p.detach().numpy().ravel().tolist() for p in model.parameters()]


def replay_reference(sizes_and_steps):
    """One process going through each epoch's shuffled order in global batches of
    size * PER_RANK_BATCH consecutive samples (what ElasticSampler hands the ranks together),
    from rank 0's initial weights, with plain SGD+momentum. ``sizes_and_steps``: for epoch 0, a
    list of (size, steps or None = to the end of the epoch); later epochs use the last size."""
    import torch

    x, y = torch_data()
    model = initial_model(100)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    def step(rows):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()

    for epoch in range(EPOCHS):
        order = list(range(N_SAMPLES))
        random.Random(SAMPLER_SEED + epoch).shuffle(order)
        phases = sizes_and_steps if epoch == 0 else [(sizes_and_steps[-1][0], None)]
        pos = 0
        for size, steps in phases:
            chunk = size * PER_RANK_BATCH
            done = 0
            while pos < N_SAMPLES and (steps is None or done < steps):
                step(order[pos:pos + chunk])
                pos += chunk
                done += 1
    return weights_of(model)


# ------------------------------------------------------------------------------------ modes

def torch_api():
    import torch

    import collectives.torch as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)
    report = Report(r)

    def object_state_commit_restore():
        state = hvd.elastic.ObjectState(epoch=1, tags=("a",))
        state.commit()
        state.epoch, state.tags = 5, ("b",)
        state.restore()
        assert (state.epoch, state.tags) == (1, ("a",)), (state.epoch, state.tags)
        assert state.commit_id == 1
    chk.check("ObjectState: restore() rolls back to the last commit", object_state_commit_restore)

    def object_state_sync():
        state = hvd.elastic.ObjectState(value=r * 10, name=f"rank{r}")
        state.sync()
        everyone = hvd.allgather_object((state.value, state.name))
        assert everyone == [(0, "rank0")] * n, everyone
    chk.check("ObjectState: sync() gives every rank rank 0's values", object_state_sync)

    def torch_state_commit_restore():
        model = initial_model(5)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        model(torch.ones(3, 4, dtype=torch.float64)).sum().backward()
        opt.step()
        state = hvd.elastic.TorchState(model, opt, step=1)
        committed_w = [p.detach().clone() for p in model.parameters()]
        committed_m = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
        state.commit()
        model(torch.ones(3, 4, dtype=torch.float64)).sum().backward()
        opt.step()
        state.step = 2
        assert not torch.equal(committed_w[0], model.weight.detach())
        state.restore()
        for p, w, m in zip(model.parameters(), committed_w, committed_m):
            assert torch.equal(p.detach(), w)
            assert torch.equal(opt.state[p]["exp_avg"], m)
        assert state.step == 1
    chk.check("TorchState: restore() rolls model, Adam state and objects back", torch_state_commit_restore)

    def torch_state_sync():
        model = initial_model(200 + r)  # different weights on every rank
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        state = hvd.elastic.TorchState(model, opt, counter=r)
        state.sync()
        expected = weights_of(initial_model(200))
        assert weights_of(model) == expected, (weights_of(model), expected)
        assert hvd.allgather_object(state.counter) == [0] * n
        # The synced values are the committed ones: a restore keeps them.
        with torch.no_grad():
            model.weight.add_(1.0)
        state.restore()
        assert weights_of(model) == expected
    chk.check("TorchState: sync() makes every rank's model rank 0's", torch_state_sync)

    def reset_callbacks():
        calls = []
        state = hvd.elastic.ObjectState(x=0)
        state.register_reset_callbacks([lambda: calls.append("a")])
        state.register_reset_callbacks([lambda: calls.append("b")])
        state.on_reset()
        assert calls == ["a", "b"], calls
    chk.check("register_reset_callbacks: on_reset() runs them in order", reset_callbacks)

    def no_host_updates_under_mpirun():
        state = hvd.elastic.ObjectState(x=0)
        for _ in range(3):
            state.commit()
        state.check_host_updates()
        assert state.commit_id == 3
    chk.check("commit()/check_host_updates() under plain mpirun never interrupt", no_host_updates_under_mpirun)

    def sampler_partitions():
        dataset = list(range(19))  # does not divide by 2 or 3: the first samples pad
        s = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
        first = hvd.allgather_object(list(s))
        flat = [i for part in first for i in part]
        assert len(flat) == n * len(s) and set(flat) == set(range(19)) and 0 < len(flat) - 19 < n, first
        # Two batches of 2 done by every rank, recorded on every rank alike.
        s.record_batch(0, 2)
        s.record_batch(1, 2)
        done = {i for part in first for i in part[:4]}
        assert s.processed_indices == done, (s.processed_indices, done)
        t = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
        t.load_state_dict(s.state_dict())
        rest = hvd.allgather_object(list(t))
        given = [i for part in rest for i in part]
        assert set(given) == set(range(19)) - done, given
        assert len(given) - len(set(given)) < n  # only the padding repeats
        # Horovod 0.28's state_dict format (a count of the shuffled order) is accepted.
        u = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
        u.load_state_dict({"epoch": 0, "processed_num": 6})
        assert len(u.processed_indices) == 6 and len(u.remaining_indices) == 13
        s.set_epoch(1)
        assert s.processed_indices == set() and len(s.remaining_indices) == 19
    chk.check("ElasticSampler: partitions, record_batch, state_dict round trip, set_epoch", sampler_partitions)

    def fixed_size_training():
        state, train = build_torch_job(hvd, report)
        final = train(state)
        expected = replay_reference([(n, None)])
        np.testing.assert_allclose(np.array(final[0] + final[1]), np.array(expected[0] + expected[1]),
                                   rtol=1e-9, atol=1e-12)
        everyone = hvd.allgather_object(final)
        assert all(w == everyone[0] for w in everyone), everyone
        # (the Horovod recipe's `for state.epoch in range(...)` leaves the last epoch's number)
        assert state.epoch == EPOCHS - 1, state.epoch
        assert state.commit_id == EPOCHS * (N_SAMPLES // (n * PER_RANK_BATCH)), state.commit_id
    chk.check("Horovod-style torch elastic job under plain mpirun = one-process replay", fixed_size_training)

    hvd.shutdown()
    chk.finish()


def keras_api():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf  # noqa: F401

    import collectives.keras as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    chk = Checker(r)
    micro, steps, epochs = 4, 3, 3

    def mlp(seed):
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)])

    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * n * micro, 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 1))).astype(np.float32)

    def keras_state_commit_restore_sync():
        model = mlp(10 + r)  # different on every rank
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        state = hvd.elastic.KerasState(model, batch=0, epoch=0)
        assert len(state._saved_optimizer_state) > 2, "optimizer slots must exist before the first step"
        state.sync()
        root = hvd.broadcast_object([w for w in model.get_weights()], root_rank=0)
        for a, b in zip(model.get_weights(), root):
            np.testing.assert_array_equal(a, b)
        model.fit(x[:8], y[:8], batch_size=4, epochs=1, verbose=0, shuffle=False)
        state.epoch = 1
        state.commit()
        committed = model.get_weights()
        committed_opt = [v.numpy() for v in model.optimizer.variables]
        model.fit(x[:8], y[:8], batch_size=4, epochs=1, verbose=0, shuffle=False)
        state.epoch = 2
        state.restore()
        for a, b in zip(model.get_weights(), committed):
            np.testing.assert_array_equal(a, b)
        for v, b in zip(model.optimizer.variables, committed_opt):
            np.testing.assert_array_equal(v.numpy(), b)
        assert state.epoch == 1
    chk.check("KerasState: sync() equalizes, restore() rolls model, Adam slots and objects back",
              keras_state_commit_restore_sync)

    def keras_fixed_size_training():
        model, ref = mlp(1 + r), mlp(1)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
        ref.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        state = hvd.elastic.KerasState(model, batch=0, epoch=0)
        commits = []
        state.register_reset_callbacks([lambda: commits.append("reset")])
        callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                     hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]
        blocks = x.reshape(steps, n, micro, 5)[:, r].reshape(-1, 5)
        yblocks = y.reshape(steps, n, micro, 1)[:, r].reshape(-1, 1)

        @hvd.elastic.run
        def train(state):
            state.model.fit(blocks, yblocks, batch_size=micro, epochs=epochs - state.epoch, callbacks=callbacks,
                            verbose=0, shuffle=False)

        train(state)
        ref.fit(x, y, batch_size=n * micro, epochs=epochs, verbose=0, shuffle=False)
        for a, b in zip(model.get_weights(), ref.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        root = hvd.broadcast_object(model.get_weights(), root_rank=0)
        for a, b in zip(model.get_weights(), root):
            np.testing.assert_array_equal(a, b)
        assert state.epoch == epochs and state.batch == 0, (state.epoch, state.batch)
        # A commit every 2nd batch (counted across epochs, as Horovod's) and at each epoch's end.
        assert state.commit_id == (steps * epochs) // 2 + epochs, state.commit_id
        assert commits == [], commits
    chk.check("Horovod-style Keras elastic job under plain mpirun = one process on the whole batches",
              keras_fixed_size_training)

    hvd.shutdown()
    chk.finish()


def restart():
    """The torch job in elastic mode; what happens is up to the driver stand-in and GENERATION."""
    import collectives.torch as hvd

    hvd.init()
    report = Report(hvd.rank())
    if str(hvd.rank()) in os.environ.get("ELASTIC_TEST_FRESH_HOST_RANKS", "").split(","):
        # This rank plays one on a new host: its COMMIT_DIR holds nothing yet.
        os.environ["COLLECTIVES_ELASTIC_COMMIT_DIR"] = os.path.join(os.environ["COLLECTIVES_ELASTIC_COMMIT_DIR"],
                                                                    f"new-host-rank{hvd.rank()}")
    state, train = build_torch_job(hvd, report)
    final = train(state)
    report("finished", weights=final, commit=state.commit_id, size=hvd.size(),
           expected=replay_reference([(int(s), int(k) if k != "end" else None)
                                      for s, k in (p.split(":") for p in sys.argv[3].split(","))]))
    hvd.shutdown()


def peer_kill():
    import collectives.torch as hvd

    hvd.init()
    report = Report(hvd.rank())
    state, train = build_torch_job(hvd, report)
    train(state)
    report("finished")  # must not happen: rank 1 dies in epoch 0


def direct_check():
    """An ObjectState job that finds the host update with check_host_updates() of its own, after
    moving on from its last commit: the exit commits the current values (no roll back)."""
    import collectives as hvd
    import collectives.elastic  # noqa: F401 - the framework-agnostic hvd.elastic

    hvd.init()
    report = Report(hvd.rank())
    state = hvd.elastic.ObjectState(step=0, note="start")

    @hvd.elastic.run
    def train(state):
        report("start", step=state.step, note=state.note, commit=state.commit_id)
        state.step = 1
        state.commit()  # the driver stand-in answers the old version here
        state.step, state.note = 2, f"after commit {state.commit_id}"
        state.check_host_updates()  # ... and the new one here
        report("not_interrupted")

    train(state)
    report("finished", step=state.step)


if __name__ == "__main__":
    {"torch_api": torch_api, "keras_api": keras_api, "restart": restart, "peer_kill": peer_kill,
     "direct_check": direct_check}[MODE]()
