"""``collectives.keras.callbacks``: horovod.tensorflow.keras.callbacks for Keras 3 and Keras 2
(tf_keras) (implemented in ``collectives.adapters.tensorflow.keras_callbacks``)."""
from collectives.adapters.tensorflow.keras_callbacks import (
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)

__all__ = ["BestModelCheckpoint", "BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback"]
