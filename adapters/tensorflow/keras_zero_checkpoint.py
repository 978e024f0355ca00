"""The sharded Keras optimizer's state to and from a plain Keras optimizer of the same class.

Keras names a slot variable after the variable it was made for: ``add_variable_from_reference``
makes ``f"{reference.path.replace('/', '_')}_{slot}"`` (e.g. ``dense_kernel_momentum``). The
sharded optimizer's slots are made for its shard variables (keras_zero_optimizer.py), so
``<shard path>_<slot>`` is bucket b's slice of slot ``<slot>``; a plain optimizer built on the
model's variables has ``<variable path>_<slot>`` for each variable. The other variables
(iterations, learning rate, Nadam's product, a LossScaleOptimizer's scale and counter) are
scalars in the same order in both.
"""
import tensorflow as tf

from . import ops as raw
from .process_sets import included, set_rank, set_size


def _sanitized(variable):
    return variable.path.replace("/", "_")


def _communicates(process_set):
    return included(process_set) and set_size(process_set) > 1


def split_variables(optimizer):
    """``({(bucket, slot name): variable}, [other variables in order])`` of the sharded optimizer."""
    runtime = optimizer._zero()
    prefixes = [(f"{_sanitized(s)}_", b) for b, s in enumerate(runtime.shards)]
    slots, others = {}, []
    for v in optimizer.variables:
        for prefix, b in prefixes:
            if v.name.startswith(prefix) and tuple(v.shape) == (runtime.buckets[b].shard_length,):
                slots[(b, v.name[len(prefix):])] = v
                break
        else:
            others.append(v)
    return slots, others


def _plain_split(plain, slot_names):
    """A plain optimizer's ``({(variable position, slot name): variable}, [other variables])``, by
    the variables it was built on."""
    by_name = {v.name: v for v in plain.variables}
    slots = {}
    for i, var in enumerate(plain._trainable_variables):
        for name in slot_names:
            found = by_name.get(f"{_sanitized(var)}_{name}")
            if found is not None:
                slots[(i, name)] = found
    used = {id(v) for v in slots.values()}
    return slots, [v for v in plain.variables if id(v) not in used]


def shard_state_numel(optimizer):
    slots, _ = split_variables(optimizer)
    return sum(int(v.shape[0]) for v in slots.values())


def _plain_class(cls):
    """The user's class behind a dynamic subclass (keras_zero_optimizer.wrap puts it last)."""
    return cls.__bases__[-1] if getattr(cls, "_zero_stage", 0) else cls


def plain_copy(optimizer):
    """A new optimizer of the wrapped class with the wrapper's config (unbuilt)."""
    import keras

    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        inner = optimizer.inner_optimizer
        inner = _plain_class(type(inner)).from_config(inner.get_config())
        config = {k: v for k, v in optimizer.get_config().items() if k != "inner_optimizer"}
        return _plain_class(type(optimizer))(inner, **config)
    return _plain_class(type(optimizer)).from_config(optimizer.get_config())


def consolidate(optimizer, to=0):
    """Collective over the process set: rank ``to`` gets a plain optimizer holding the whole state."""
    runtime = optimizer._zero()
    if runtime.variables is None:
        raise ValueError("the optimizer is not built yet: nothing to consolidate")
    ps = optimizer._collectives_settings.process_set
    slots, others = split_variables(optimizer)
    keys = sorted(slots)
    values = [tf.convert_to_tensor(slots[k].value) for k in keys]
    comm = _communicates(ps)
    if comm and values:
        values = raw.grouped_allgather(values, name=f"{optimizer._zero().name}.consolidate",
                                       process_set=ps)
    if comm and set_rank(ps) != to:
        return None
    plain = plain_copy(optimizer)
    plain.build(runtime.variables)
    plain_slots, plain_others = _plain_split(plain, {name for _, name in keys})
    for (b, name), full in zip(keys, values):
        for slot in runtime.buckets[b].slots:
            plain_slots[(slot.index, name)].assign(tf.reshape(full[slot.offset:slot.offset + slot.numel], slot.shape))
    for mine, theirs in zip(others, plain_others):
        theirs.assign(mine)
    return plain


def load_full(optimizer, plain):
    """Every rank: take this rank's slices of a plain optimizer's state (built on the same model's variables)."""
    runtime = optimizer._zero()
    slots, _ = split_variables(optimizer)
    if not plain.built or len(plain._trainable_variables) != len(runtime.variables):
        raise ValueError(f"cannot load {type(plain).__name__}'s state: it must be built on the same model's "
                         f"{len(runtime.variables)} trainable variables")
    plain_slots, plain_others = _plain_split(plain, {name for _, name in slots})

    def lookup(index, name):
        source = plain_slots.get((index, name))
        return None if source is None else tf.convert_to_tensor(source.value)
    load_values(optimizer, lookup, [v.value for v in plain_others], type(plain).__name__)


def load_values(optimizer, lookup, others, what):
    """This rank's slices of a whole state: ``lookup(variable index, slot name)`` gives a
    variable's whole slot value (None: missing), ``others`` the other variables' values in order;
    ``what`` names the source in errors ("Adam", "the checkpoint")."""
    runtime = optimizer._zero()
    slots, mine = split_variables(optimizer)
    if len(others) != len(mine):
        raise ValueError(f"cannot load {what}'s state: {len(others)} variables that are not per-variable slots, "
                         f"{len(mine)} expected")
    for (b, name), target in slots.items():
        bucket = runtime.buckets[b]
        parts, filled = [], 0
        for slot, src, _, n in bucket.pieces():
            source = lookup(slot.index, name)
            if source is None:
                raise ValueError(f"cannot load {what}'s state: no slot {name!r} for {runtime.variables[slot.index].path}")
            parts.append(tf.reshape(tf.cast(source, target.dtype), [-1])[src:src + n])
            filled += n
        if filled < bucket.shard_length:
            parts.append(tf.zeros([bucket.shard_length - filled], target.dtype))
        target.assign(tf.concat(parts, 0))
    for variable, value in zip(mine, others):
        variable.assign(value)
