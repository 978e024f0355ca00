"""Checkpoints of the sharded optimizer (zero_optimizer.py) in two forms.

* Full: exactly the unwrapped optimizer's ``state_dict()`` (state keyed by the parameters'
  positions over the param groups, each state tensor of its parameter's shape), built on one rank
  by ``consolidate_state_dict(to)``, and loaded on every rank by ``load_state_dict``, which keeps
  this rank's slice of it.
* Sharded: each rank's own slices and the bucket layout they came from
  (``sharded_state_dict``); any number of ranks loads a complete set of them, because the
  slices are contiguous pieces of flat buckets: concatenated in rank order they give each bucket
  whole, and the recorded offsets give each parameter's state back.

A state value is elementwise when it is a tensor of its shard's shape (momentum, Adam's moments);
anything else (the step count) is the same for every element of a bucket and kept as it is.
"""
import copy
import glob
import os

import torch

from collectives import objects
from collectives.errors import InvalidArgumentError

from . import ops as raw
from .tensors import wait

FORMAT = "collectives.zero_optimizer.sharded.v1"


def _elementwise(value, shard):
    return isinstance(value, torch.Tensor) and value.shape == shard.shape


def _packed_groups(opt):
    """The outer param groups as ``Optimizer.state_dict`` packs them (parameters as positions)."""
    packed, start = [], 0
    for group in opt.param_groups:
        entry = {k: v for k, v in group.items() if k != "params"}
        entry["params"] = list(range(start, start + len(group["params"])))
        start += len(group["params"])
        packed.append(entry)
    return packed


def _params_state(buckets, bucket_states):
    """{position: {key: value}} from each bucket's whole state ({key: full-length tensor or value})."""
    state = {}
    for bucket, whole in zip(buckets, bucket_states):
        if not whole:
            continue
        for slot in bucket.slots:
            entry = {}
            for key, (is_elementwise, value) in whole.items():
                if is_elementwise:
                    entry[key] = value[slot.offset:slot.offset + slot.numel].view(slot.param.shape).clone()
                else:
                    entry[key] = value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
            state[slot.index] = entry
    return dict(sorted(state.items()))


_DTYPES = {str(t): t for t in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def consolidate(opt, to):
    """Every rank sends its slices to rank ``to`` of the set (one alltoall per bucket and state
    key, nothing to the others); returns the full state dict there, None elsewhere. The ranks
    first agree on the elementwise keys (one small allgather): a rank without state for a bucket
    (never stepped, or only the root loaded a checkpoint) sends zeros instead of hanging the rest."""
    ranks, rank = opt._ranks, opt._rank
    if not isinstance(to, int) or isinstance(to, bool) or not 0 <= to < ranks:
        raise InvalidArgumentError(f"consolidate_state_dict: to must be a rank of the process set (0..{ranks - 1}), "
                                   f"not {to!r}")
    local = [opt._inner.state.get(shard, {}) for shard in opt._shards]
    if not opt._communicates:
        return {"state": _params_state(opt._buckets, [{k: (_elementwise(v, s), v) for k, v in st.items()}
                                                      for st, s in zip(local, opt._shards)]),
                "param_groups": copy.deepcopy(_packed_groups(opt))}
    mine = [{k: str(v.dtype) for k, v in st.items() if _elementwise(v, s)} for st, s in zip(local, opt._shards)]
    everyone = objects.allgather_object(mine, name="zero_optimizer.consolidate.keys", process_set=opt.process_set)
    pending = []
    for b, shard in enumerate(opt._shards):
        keys = {}
        for theirs in everyone:
            for key, dtype in theirs[b].items():
                keys.setdefault(key, dtype)
        splits = [shard.numel() if r == to else 0 for r in range(ranks)]
        kinds = {}
        for key, dtype in keys.items():
            value = local[b].get(key)
            if value is None:
                value = torch.zeros(shard.shape, dtype=_DTYPES.get(dtype, shard.dtype), device=shard.device)
            kinds[key] = (True, raw.alltoall_async(value.contiguous(), splits, f"zero_optimizer.consolidate.{b}.{key}",
                                                   opt.process_set))
        for key, value in local[b].items():
            if key not in keys:
                kinds[key] = (False, value)
        pending.append(kinds)
    whole = [{key: (is_el, wait(v)[0] if is_el else v) for key, (is_el, v) in kinds.items()} for kinds in pending]
    if rank != to:
        return None
    return {"state": _params_state(opt._buckets, whole), "param_groups": copy.deepcopy(_packed_groups(opt))}


def _elementwise_keys(state, params):
    """Keys whose every value is a tensor of its parameter's shape."""
    keys = {}
    for index, entry in state.items():
        p = params[index]
        for key, value in entry.items():
            ok = isinstance(value, torch.Tensor) and value.shape == p.shape
            keys[key] = keys.get(key, True) and ok
    return {key for key, ok in keys.items() if ok}


def _load_inner(opt, inner_state):
    """The shards' state ({inner position: state}) into the inner optimizer, with the outer
    groups' hyperparameters."""
    opt._sync_hyperparameters()
    inner_groups = []
    for group in opt._inner.param_groups:
        entry = {k: v for k, v in group.items() if k != "params"}
        entry["params"] = [opt._inner_index[opt._shard_bucket[id(s)]] for s in group["params"]]
        inner_groups.append(entry)
    opt._inner.load_state_dict({"state": inner_state, "param_groups": inner_groups})


def load_full(opt, state_dict):
    """Load an unwrapped optimizer's state dict: hyperparameters into the param groups, this
    rank's slices of the state into the shards."""
    saved_groups = state_dict["param_groups"]
    groups = opt.param_groups
    if len(saved_groups) != len(groups):
        raise ValueError("loaded state dict has a different number of parameter groups")
    if any(len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, groups)):
        raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                         "optimizer's group")
    position = {}  # saved id -> our position over the groups
    params = [p for g in groups for p in g["params"]]
    for saved_id, i in zip((pid for s in saved_groups for pid in s["params"]), range(len(params))):
        position[saved_id] = i
    saved_state = {position[k]: v for k, v in state_dict["state"].items() if k in position}
    for group, saved in zip(groups, saved_groups):
        for key, value in saved.items():
            if key not in ("params", "param_names"):
                group[key] = copy.deepcopy(value)
    elementwise = _elementwise_keys(saved_state, params)
    inner_state = {}
    for b, (bucket, shard) in enumerate(zip(opt._buckets, opt._shards)):
        entries = [(slot, saved_state.get(slot.index)) for slot in bucket.slots]
        if not any(entry for _, entry in entries):
            continue
        shard_state = {}
        for slot, entry in entries:
            for key, value in (entry or {}).items():
                if key in elementwise:
                    if key not in shard_state:
                        shard_state[key] = torch.zeros(shard.shape, dtype=value.dtype, device=shard.device)
                elif key not in shard_state:
                    shard_state[key] = value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
        for slot, src, dst, n in bucket.pieces():
            entry = saved_state.get(slot.index) or {}
            for key, value in entry.items():
                if key in elementwise:
                    shard_state[key][dst:dst + n].copy_(value.detach().reshape(-1)[src:src + n])
        inner_state[opt._inner_index[b]] = shard_state
    _load_inner(opt, inner_state)


def sharded(opt):
    """This rank's slices of the state, with the layout they came from."""
    params = [p for g in opt.param_groups for p in g["params"]]
    return {
        "format": FORMAT,
        "ranks": opt._ranks,
        "rank": opt._rank,
        "shapes": [list(p.shape) for p in params],
        "buckets": [{"length": b.length, "shard_start": b.shard_start, "shard_length": b.shard_length,
                     "slots": [(s.index, s.offset, s.numel) for s in b.slots]} for b in opt._buckets],
        "state": [{k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
                   for k, v in opt._inner.state.get(shard, {}).items()} for shard in opt._shards],
        "param_groups": copy.deepcopy(_packed_groups(opt)),
    }


def load_own(opt, saved):
    """Load this rank's own ``sharded()`` back (the same layout: an elastic in-memory restore)."""
    if saved.get("format") != FORMAT or saved["ranks"] != opt._ranks or saved["rank"] != opt._rank:
        load_full(opt, full_from_shards([saved]))  # raises: not a complete set on its own
    inner_state = {opt._inner_index[b]: {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
                                         for k, v in st.items()}
                   for b, st in enumerate(saved["state"]) if st}
    for group, packed in zip(opt.param_groups, saved["param_groups"]):
        for key, value in packed.items():
            if key not in ("params", "param_names"):
                group[key] = copy.deepcopy(value)
    _load_inner(opt, inner_state)


def shard_file(directory, rank, ranks):
    return os.path.join(directory, f"zero-shard-{rank:05d}-of-{ranks:05d}.pt")


def read_shards(directory):
    files = sorted(glob.glob(os.path.join(directory, "zero-shard-*-of-*.pt")))
    if not files:
        raise InvalidArgumentError(f"load_sharded_state_dict: no zero-shard-*-of-*.pt files in {directory}")
    return [torch.load(f, map_location="cpu", weights_only=True) for f in files]


def full_from_shards(shards):
    """The unwrapped optimizer's state dict from a complete set of sharded state dicts."""
    if not shards or any(not isinstance(s, dict) or s.get("format") != FORMAT for s in shards):
        raise InvalidArgumentError("load_sharded_state_dict takes every rank's sharded_state_dict() (a list, or the "
                                   "directory save_sharded_state_dict wrote)")
    ranks = shards[0]["ranks"]
    by_rank = {s["rank"]: s for s in shards}
    if sorted(by_rank) != list(range(ranks)) or len(shards) != ranks or any(s["ranks"] != ranks for s in shards):
        raise InvalidArgumentError(f"load_sharded_state_dict: expected the shards of ranks 0..{ranks - 1} of one "
                                   f"save, got ranks {sorted(s['rank'] for s in shards)} of "
                                   f"{sorted({s['ranks'] for s in shards})}")
    ordered = [by_rank[r] for r in range(ranks)]
    shapes = ordered[0]["shapes"]
    state = {}
    for b, layout in enumerate(ordered[0]["buckets"]):
        first = ordered[0]["state"][b]
        if not first:
            continue
        whole = {}
        for key, value in first.items():
            if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == layout["shard_length"]:
                whole[key] = torch.cat([s["state"][b][key] for s in ordered])
            else:
                whole[key] = None
        for index, offset, numel in layout["slots"]:
            state[index] = {key: (first[key] if full is None else full[offset:offset + numel].view(shapes[index]))
                            for key, full in whole.items()}
    return {"state": dict(sorted(state.items())), "param_groups": ordered[0]["param_groups"]}
