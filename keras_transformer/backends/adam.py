"""The ``fused_adam`` fast path: Adam's update as one fused kernel per
variable.

Keras writes Adam's update as about ten tensor operations per variable,
each a pass over the variable. The update is memory-bound; on
TensorFlow each variable is updated by one kernel that reads the
gradient, variable and moments once:

- TensorFlow's graph executor: ``ResourceApplyAdam``. Keras's update is
  kept for sparse (``IndexedSlices``) gradients, inside a `tf.distribute`
  strategy, and under XLA (``jit_compile=True``), which fuses Keras's
  operations itself.

The arithmetic is Keras's, ``alpha = lr * sqrt(1 - beta_2^t) / (1 -
beta_1^t)``, ``m += (g - m) (1 - beta_1)``, ``v += (g^2 - v) (1 -
beta_2)`` and ``var -= alpha * m / (sqrt(v) + epsilon)``, to float
rounding, and so are the slots (`training.Adam`'s own).
"""

import keras


def tensorflow_update(optimizer, gradient, variable, learning_rate):
    """``ResourceApplyAdam`` on ``variable`` (TensorFlow); False where
    Keras's update runs instead."""
    import tensorflow as tf

    if (
        isinstance(gradient, tf.IndexedSlices)
        or tf.distribute.has_strategy()
        or _in_xla_context()
    ):
        return False
    if isinstance(variable, keras.Variable):
        variable = variable.value
    index = optimizer._get_variable_index(variable)
    dtype = variable.dtype
    step = tf.cast(optimizer.iterations + 1, dtype)
    beta_1 = tf.cast(optimizer.beta_1, dtype)
    beta_2 = tf.cast(optimizer.beta_2, dtype)
    tf.raw_ops.ResourceApplyAdam(
        var=variable.handle,
        m=optimizer._momentums[index].value.handle,
        v=optimizer._velocities[index].value.handle,
        beta1_power=tf.pow(beta_1, step),
        beta2_power=tf.pow(beta_2, step),
        lr=tf.cast(learning_rate, dtype),
        beta1=beta_1,
        beta2=beta_2,
        epsilon=tf.cast(optimizer.epsilon, dtype),
        grad=tf.cast(gradient, dtype),
    )
    return True


def _in_xla_context():
    """Whether TensorFlow is tracing for XLA (``jit_compile=True``).

    TensorFlow has no public test for it; where its private one is
    missing, the answer is False and the fused op runs under XLA too,
    correct but slower.
    """
    try:
        import tensorflow as tf
        from tensorflow.python.ops import control_flow_util
    except ImportError:
        return False
    check = getattr(control_flow_util, "GraphOrParentsInXlaContext", None)
    if check is None:
        return False
    return bool(check(tf.compat.v1.get_default_graph()))
