"""Sharded checkpoints of the sharded Keras optimizer (keras_zero_optimizer.py), as the torch
side's ``save_sharded_state_dict`` (adapters/torch/zero_checkpoint.py): each rank writes only its
slices, and any number of ranks loads a complete set (saved at 2, loaded at 3 or at 1). An
elastic commit (elastic_state.py) holds every rank's such state, so a restart at another size
redistributes the slices.

A sharded state dict is plain values and numpy arrays::

    {"format", "ranks", "rank",
     "variables": [(shape, dtype name)] of the model's trainable variables, in the optimizer's order,
     "buckets":   [{"length", "shard_length", "slots": [(variable index, offset, numel)]}],
     "slots":     {slot name: [this rank's slice of bucket b, or None]},
     "others":    [values of the other optimizer variables (iterations, learning rate, ...)]}

Every rank's slice of a bucket is the same length and contiguous, so the slices of ranks
0..N-1 concatenated are the bucket whole, and the recorded offsets give each variable's state:
``full_from_shards`` makes that per-variable state, which ``load`` cuts for the new layout.

Files (``zero-shard-RRRRR-of-NNNNN.npz``): numpy's npz, read with ``allow_pickle=False``; the
layout is one JSON string, arrays of dtypes numpy lacks (bfloat16) are stored as raw unsigned
integers of their width and viewed back by the dtype name the layout records.
"""
import glob
import json
import os

import numpy as np
import tensorflow as tf

from collectives.errors import InvalidArgumentError

from . import keras_zero_checkpoint as checkpoint

FORMAT = "collectives.keras_zero.sharded.v1"
FILE_PATTERN = "zero-shard-*-of-*.npz"


def _read(variable, values):
    """A numpy copy of ``variable``'s value, or of its value in ``values`` ({id: value})."""
    value = values[id(variable)] if values is not None else variable.numpy()
    return np.array(value, copy=True)


def sharded(optimizer, values=None):
    """This rank's sharded state dict. ``values`` ({id(variable): value}) takes the optimizer
    variables' values from there (an elastic commit's saved copy) instead of the variables."""
    runtime = optimizer._zero()
    if runtime.variables is None:
        raise ValueError("the optimizer is not built yet: nothing to consolidate or save (build it on the model's "
                         "trainable variables first)")
    slots, others = checkpoint.split_variables(optimizer)
    per_name = {}
    for (b, name), variable in slots.items():
        per_name.setdefault(name, [None] * len(runtime.buckets))[b] = _read(variable, values)
    return {
        "format": FORMAT,
        "ranks": runtime.ranks,
        "rank": runtime.rank,
        "variables": [(tuple(int(d) for d in v.shape), tf.as_dtype(v.dtype).name) for v in runtime.variables],
        "buckets": [{"length": b.length, "shard_length": b.shard_length,
                     "slots": [(s.index, s.offset, s.numel) for s in b.slots]} for b in runtime.buckets],
        "slots": per_name,
        "others": [_read(v, values) for v in others],
    }


def _check_set(shards):
    """The shards of ranks 0..N-1 of one save, in rank order."""
    if not shards or any(not isinstance(s, dict) or s.get("format") != FORMAT for s in shards):
        raise InvalidArgumentError("load_sharded_state_dict takes every rank's sharded_state_dict() (a list, or the "
                                   "directory save_sharded_state_dict wrote)")
    ranks = shards[0]["ranks"]
    by_rank = {s["rank"]: s for s in shards}
    if sorted(by_rank) != list(range(ranks)) or len(shards) != ranks or any(s["ranks"] != ranks for s in shards):
        raise InvalidArgumentError(f"load_sharded_state_dict: expected the shards of ranks 0..{ranks - 1} of one "
                                   f"save, got ranks {sorted(s['rank'] for s in shards)} of "
                                   f"{sorted({s['ranks'] for s in shards})}")
    return [by_rank[r] for r in range(ranks)]


def full_from_shards(shards):
    """``(variables, {(variable index, slot name): whole value}, others)`` from a complete set."""
    ordered = _check_set(list(shards))
    first = ordered[0]
    variables = [(tuple(shape), dtype) for shape, dtype in first["variables"]]
    per_variable = {}
    for name, slices in first["slots"].items():
        for b, layout in enumerate(first["buckets"]):
            if slices[b] is None:
                continue
            whole = np.concatenate([s["slots"][name][b] for s in ordered])
            for index, offset, numel in layout["slots"]:
                per_variable[(index, name)] = whole[offset:offset + numel].reshape(variables[index][0])
    return variables, per_variable, list(first["others"])


def load(optimizer, variables, per_variable, others):
    """Every rank: this rank's slices of a per-variable state (``full_from_shards``)."""
    runtime = optimizer._zero()
    if runtime.variables is None:
        raise ValueError("load_sharded_state_dict: build the optimizer on the model's trainable variables first "
                         "(opt.build(model.trainable_variables)), then load its state")
    mine = [(tuple(int(d) for d in v.shape), tf.as_dtype(v.dtype).name) for v in runtime.variables]
    if mine != variables:
        raise InvalidArgumentError(
            f"load_sharded_state_dict: the checkpoint's variables differ from this optimizer's "
            f"({_first_difference(variables, mine)}): load it into an optimizer built on the same model's "
            f"trainable variables")
    checkpoint.load_values(optimizer, lambda index, name: per_variable.get((index, name)), others,
                           "the checkpoint")


def _first_difference(theirs, mine):
    if len(theirs) != len(mine):
        return f"{len(theirs)} variables in the checkpoint, {len(mine)} here"
    for i, (a, b) in enumerate(zip(theirs, mine)):
        if a != b:
            return f"variable {i}: {list(a[0])} {a[1]} in the checkpoint, {list(b[0])} {b[1]} here"
    return "none"


def load_shards(optimizer, shards):
    """``load_sharded_state_dict``: a list of every rank's state dicts, or a directory of files."""
    if isinstance(shards, (str, os.PathLike)):
        shards = read_files(shards)
    load(optimizer, *full_from_shards(list(shards)))


# -- files

def shard_file(directory, rank, ranks):
    return os.path.join(directory, f"zero-shard-{rank:05d}-of-{ranks:05d}.npz")


def _storable(array):
    """(array numpy can save without pickling, dtype name to view it back)."""
    name = tf.as_dtype(array.dtype).name
    if array.dtype.kind not in "biufc":  # bfloat16 and friends (ml_dtypes): their bits as unsigned ints
        array = array.view(f"u{array.dtype.itemsize}")
    return array, name


def _restored(array, name):
    dtype = np.dtype(tf.as_dtype(name).as_numpy_dtype)
    return array.view(dtype) if array.dtype != dtype else array


def write_file(state, directory):
    os.makedirs(directory, exist_ok=True)
    arrays, dtypes = {}, {}
    for name, slices in state["slots"].items():
        for b, value in enumerate(slices):
            if value is not None:
                key = f"slot{len(arrays)}"
                arrays[key], dtypes[key] = _storable(value)
                dtypes[key] = (dtypes[key], name, b)
    for i, value in enumerate(state["others"]):
        key = f"other{i}"
        arrays[key], kind = _storable(np.asarray(value))
        dtypes[key] = (kind, None, i)
    layout = {k: state[k] for k in ("format", "ranks", "rank", "variables", "buckets")}
    layout["arrays"] = dtypes
    layout["slot_names"] = sorted(state["slots"])
    path = shard_file(directory, state["rank"], state["ranks"])
    tmp = f"{path}.tmp.npz"
    np.savez(tmp, layout=np.array(json.dumps(layout)), **arrays)
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def read_file(path):
    with np.load(path, allow_pickle=False) as data:
        layout = json.loads(str(data["layout"]))
        if layout.get("format") != FORMAT:
            raise InvalidArgumentError(f"load_sharded_state_dict: {path} is not a sharded Keras optimizer state "
                                       f"({FORMAT})")
        nbuckets = len(layout["buckets"])
        slots = {name: [None] * nbuckets for name in layout["slot_names"]}
        others = {}
        for key, (dtype, name, position) in layout["arrays"].items():
            value = _restored(data[key], dtype)
            if name is None:
                others[position] = value
            else:
                slots[name][position] = value
    state = {k: layout[k] for k in ("format", "ranks", "rank", "variables", "buckets")}
    state["slots"] = slots
    state["others"] = [others[i] for i in range(len(others))]
    return state


def read_files(directory):
    files = sorted(glob.glob(os.path.join(os.fspath(directory), FILE_PATTERN)))
    if not files:
        raise InvalidArgumentError(f"load_sharded_state_dict: no {FILE_PATTERN} files in {os.fspath(directory)}")
    return [read_file(f) for f in files]
