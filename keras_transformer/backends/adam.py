"""The ``fused_adam`` fast path: Adam's update as one fused kernel per
variable.

Keras writes Adam's update as about ten tensor operations per variable,
each a pass over the variable. The update is memory-bound; here each
variable is updated by one kernel that reads the gradient, variable and
moments once:

- TensorFlow's graph executor: ``ResourceApplyAdam``. Keras's update is
  kept for sparse (``IndexedSlices``) gradients, inside a `tf.distribute`
  strategy, and under XLA (``jit_compile=True``), which fuses Keras's
  operations itself.
- torch on the CPU: ``torch._fused_adam_``, the kernel of
  `torch.optim.Adam(fused=True)`, over all variables at once. Keras's
  update is kept where torch lacks the kernel, under `torch.compile`,
  off the CPU and for variables whose layout is not contiguous.

The arithmetic is Keras's, ``alpha = lr * sqrt(1 - beta_2^t) / (1 -
beta_1^t)``, ``m += (g - m) (1 - beta_1)``, ``v += (g^2 - v) (1 -
beta_2)`` and ``var -= alpha * m / (sqrt(v) + epsilon)``, to float
rounding, and so are the slots (`training.Adam`'s own).
"""

import math

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


def torch_update(optimizer, grads, variables, learning_rate):
    """``torch._fused_adam_`` over ``variables`` (torch), one call per
    dtype; returns the ``(grads, variables)`` left to Keras's update."""
    import torch

    fused = getattr(torch, "_fused_adam_", None)
    if fused is None or torch.compiler.is_compiling():
        return grads, variables
    groups, rest = {}, ([], [])
    for grad, variable in zip(grads, variables, strict=True):
        index = optimizer._get_variable_index(variable)
        tensors = (
            variable.value,
            grad,
            optimizer._momentums[index].value,
            optimizer._velocities[index].value,
        )
        # The kernel walks the four tensors of a variable by flat offset,
        # so they must share one layout: Keras's slots are contiguous, a
        # variable made from a transposed array is not.
        value, _, m, v = tensors
        if all(t.device.type == "cpu" for t in tensors) and all(
            t.is_contiguous() for t in (value, m, v)
        ):
            group = groups.setdefault(tensors[0].dtype, ([], [], [], []))
            for part, tensor in zip(group, tensors, strict=True):
                part.append(tensor)
        else:
            rest[0].append(grad)
            rest[1].append(variable)
    for dtype, (values, grads_, moments, velocities) in groups.items():
        grads_ = [g.to(dtype).contiguous() for g in grads_]
        _fused_adam(
            fused, optimizer, learning_rate, values, grads_, moments, velocities
        )
    return rest


def _fused_adam(
    fused, optimizer, learning_rate, values, grads, moments, velocities
):
    import torch

    # On the CPU the step count and learning rate are read for free.
    step = int(keras.ops.convert_to_numpy(optimizer.iterations)) + 1
    bias_2 = 1 - float(optimizer.beta_2) ** step
    with torch.no_grad():
        fused(
            values,
            grads,
            moments,
            velocities,
            [],
            [torch.tensor(float(step))] * len(values),
            lr=float(keras.ops.convert_to_numpy(learning_rate)),
            beta1=float(optimizer.beta_1),
            beta2=float(optimizer.beta_2),
            weight_decay=0.0,
            # torch divides by sqrt(1 - beta_2^t) before adding epsilon,
            # Keras after: sqrt(v) / s + epsilon / s is Keras's
            # (sqrt(v) + epsilon) / s.
            eps=float(optimizer.epsilon) / math.sqrt(bias_2),
            amsgrad=False,
            maximize=False,
        )


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
