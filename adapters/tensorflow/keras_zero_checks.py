"""What the sharded Keras optimizer (keras_zero_optimizer.py) refuses, on this rank; the wrapper
shares the refusal with the other ranks (collectives/zero_agreement.py) so every rank raises it."""
from collectives.errors import NotSupportedError
from collectives.zero_arguments import refuse_not_elementwise

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
        refuse_not_elementwise(stage, type(inner), ELEMENTWISE_NAMES, "variables")
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
