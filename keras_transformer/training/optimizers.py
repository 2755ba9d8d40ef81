"""`Adam`: Keras's Adam, with a faster update on TensorFlow and torch."""

import keras

from keras_transformer import backends


@keras.saving.register_keras_serializable(package="keras_transformer")
class Adam(keras.optimizers.Adam):
    """`keras.optimizers.Adam`, with the same update, faster on
    TensorFlow and torch.

    Keras writes Adam's update as about ten tensor operations per
    variable, each a pass over the variable. Where the ``fused_adam``
    fast path applies (TensorFlow's graph executor; see
    `keras_transformer.backends.adam`), each variable is updated by one
    fused kernel that reads the gradient, variable and moments once;
    elsewhere, and with that path switched off, Keras's code runs.

    With ``gradient_accumulation_steps``, a learning-rate schedule is
    evaluated at the number of updates (`iterations`), as
    `transformer_optimizer` promises, where Keras's Adam evaluates it at
    the number of batches.

    The arithmetic is Keras's, ``alpha = lr * sqrt(1 - beta_2^t) / (1 -
    beta_1^t)``, ``m += (g - m) (1 - beta_1)``, ``v += (g^2 - v) (1 -
    beta_2)`` and ``var -= alpha * m / (sqrt(v) + epsilon)``, to float
    rounding, and so are the slots, so checkpoints move freely between
    this class and `keras.optimizers.Adam`. ``amsgrad=True`` and
    everything around the update (gradient accumulation, clipping, loss
    scaling, weight decay, EMA) run Keras's own code.

    Example:
    >>> optimizer = Adam(1e-3, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    """

    def _get_current_learning_rate(self):
        # Keras evaluates a schedule at its batch counter, which with
        # ``gradient_accumulation_steps`` runs ahead of the updates; the
        # paper's schedule (and `TransformerSchedule`'s warm-up and
        # cool-down) counts updates, `self.iterations`.
        if self.gradient_accumulation_steps and isinstance(
            self._learning_rate,
            keras.optimizers.schedules.LearningRateSchedule,
        ):
            return self._learning_rate(self.iterations)
        return super()._get_current_learning_rate()

    def build(self, variables):
        super().build(variables)
        # The ``fused_adam`` fast path where it applies (see
        # `keras_transformer.backends`), chosen once.
        self._fused = None if self.amsgrad else backends.fused_adam()

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # On torch Keras updates all variables here, without `update_step`.
        fused = getattr(self, "_fused", None)
        if fused and keras.backend.backend() == "torch":
            grads, trainable_variables = fused.torch_update(
                self, grads, trainable_variables, learning_rate
            )
            if not trainable_variables:
                return
        super()._backend_update_step(grads, trainable_variables, learning_rate)

    def update_step(self, gradient, variable, learning_rate):
        # Called per variable by Keras's `_backend_update_step` on JAX and
        # TensorFlow (inside its `tf.distribute` plumbing on TensorFlow).
        fused = getattr(self, "_fused", None)
        if (
            fused
            and keras.backend.backend() == "tensorflow"
            and fused.tensorflow_update(self, gradient, variable, learning_rate)
        ):
            return
        super().update_step(gradient, variable, learning_rate)
