"""What the sharded Keras optimizer (keras_zero_optimizer.py) refuses, on this rank; the wrapper
shares the refusal with the other ranks (collectives/zero_agreement.py) so every rank raises it."""
from collectives.constants import Adasum, Average
from collectives.errors import InvalidArgumentError, NotSupportedError

# Keras 3 optimizers whose update of each element depends only on that element's gradient, state
# and scalars (the step count, the learning rate): they step a flat shard exactly as whole
# variables. Subclasses are taken as the same kind. Lamb (per-variable trust ratios), Muon
# (orthogonalized matrices) and Adafactor (factored row/column state) need whole tensors.
ELEMENTWISE_NAMES = ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Nadam", "Adamax", "Lion")


def elementwise_classes():
    import keras

    return tuple(getattr(keras.optimizers, name) for name in ELEMENTWISE_NAMES if hasattr(keras.optimizers, name))


def check_optimizer(optimizer, stage):
    """Raises what this rank cannot shard about a Keras 3 optimizer (a LossScaleOptimizer: its inner one)."""
    import keras

    inner = optimizer.inner_optimizer if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else optimizer
    if not isinstance(inner, elementwise_classes()):
        raise NotSupportedError(
            f"zero_stage={stage}: {type(inner).__name__} cannot step on a shard of the variables (its update "
            f"needs whole tensors, or it is not known to be elementwise); supported: {', '.join(ELEMENTWISE_NAMES)} "
            f"and their subclasses. Use zero_stage=0 for it.")
    refusals = [
        (inner.clipnorm, "clipnorm (per-variable norm clipping) would see only this rank's flat shard; use "
                         "global_clipnorm, which the sharded optimizer computes over every shard"),
        (inner.use_ema, "use_ema (the moving average would exist only for this rank's shard)"),
        (inner.gradient_accumulation_steps, "gradient_accumulation_steps; use DistributedOptimizer's "
                                            "backward_passes_per_step instead"),
        (getattr(inner, "_exclude_from_weight_decay", None) or getattr(inner, "_exclude_from_weight_decay_pattern",
                                                                        None),
         "exclude_from_weight_decay (the shards hold several variables each)"),
    ]
    for present, what in refusals:
        if present:
            raise NotSupportedError(f"zero_stage={stage} does not support {what}")


def check_arguments(stage, op, gradient_predivide_factor, backward_passes_per_step, groups):
    if isinstance(stage, bool) or stage not in (1, 2):
        raise InvalidArgumentError(f"zero_stage must be 0 (no sharding), 1 (optimizer state sharded) or 2 "
                                   f"(gradients too), not {stage!r}")
    if op == Adasum:
        raise NotSupportedError(f"zero_stage={stage} cannot be combined with op=Adasum (Adasum combines whole "
                                f"optimizer steps, not gradient shards); use op=Average or op=Sum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    if groups is not None:
        raise InvalidArgumentError(f"zero_stage={stage}: groups/num_groups do not apply (gradients travel in flat "
                                   f"buckets); leave them unset")
