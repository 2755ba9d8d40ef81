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
  `torch.optim.Adam(fused=True)`. On other devices, for variables that
  are not contiguous, under `torch.compile` and where torch lacks the
  kernel, each variable is updated in turn by torch's in-place kernels
  (``lerp_``, ``addcmul_``) and one reused scratch buffer per dtype.

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


def torch_update(optimizer, grads, trainable_variables, learning_rate):
    """Adam's update of every variable on torch."""
    import torch

    with torch.no_grad():
        _torch_update(optimizer, grads, trainable_variables, learning_rate)


def _torch_update(optimizer, grads, trainable_variables, learning_rate):
    import torch

    fused = getattr(torch, "_fused_adam_", None)
    # Under torch.compile the host reads below would break the graph.
    compiling = getattr(torch.compiler, "is_compiling", lambda: False)()
    groups = {}
    for variable, grad in zip(trainable_variables, grads, strict=True):
        index = optimizer._get_variable_index(variable)
        value = variable.value
        m = optimizer._momentums[index].value
        v = optimizer._velocities[index].value
        # The fused kernel walks the four tensors by flat offset, so
        # they must share one layout: Keras's slots are contiguous, a
        # variable made from a transposed array is not.
        fusible = (
            fused is not None
            and not compiling
            and value.device.type == "cpu"
            and value.is_contiguous()
            and m.is_contiguous()
            and v.is_contiguous()
        )
        group = groups.setdefault((fusible, value.dtype), ([], [], [], []))
        for part, tensor in zip(group, (value, grad, m, v), strict=True):
            part.append(tensor)
    for (fusible, dtype), (
        values,
        grads,
        moments,
        velocities,
    ) in groups.items():
        grads = [grad.to(dtype) for grad in grads]
        if fusible:
            _torch_fused_update(
                optimizer,
                fused,
                values,
                grads,
                moments,
                velocities,
                learning_rate,
            )
        else:
            _torch_update_loop(
                optimizer, values, grads, moments, velocities, learning_rate
            )


def _torch_fused_update(
    optimizer, fused, values, grads, moments, velocities, learning_rate
):
    import torch

    # On the CPU the step count and learning rate are read for free.
    step = int(keras.ops.convert_to_numpy(optimizer.iterations)) + 1
    bias_2 = 1 - float(optimizer.beta_2) ** step
    # torch divides by sqrt(1 - beta_2^t) before adding epsilon, Keras
    # after: sqrt(v) / s + epsilon / s is Keras's (sqrt(v) + epsilon) / s.
    step_tensor = torch.tensor(float(step))
    fused(
        values,
        [grad.contiguous() for grad in grads],
        moments,
        velocities,
        [],
        [step_tensor] * len(values),
        lr=float(learning_rate),
        beta1=float(optimizer.beta_1),
        beta2=float(optimizer.beta_2),
        weight_decay=0.0,
        eps=float(optimizer.epsilon) / math.sqrt(bias_2),
        amsgrad=False,
        maximize=False,
    )


def _torch_update_loop(
    optimizer, values, grads, moments, velocities, learning_rate
):
    import torch

    dtype, device = values[0].dtype, values[0].device
    lr = keras.ops.convert_to_tensor(learning_rate).to(dtype)
    step = keras.ops.convert_to_tensor(optimizer.iterations + 1).to(dtype)
    alpha = (
        lr
        * torch.sqrt(1 - optimizer.beta_2**step)
        / (1 - optimizer.beta_1**step)
    )
    # One buffer for every variable's ``sqrt(v) + epsilon``: a new
    # tensor per variable and step costs the allocator page faults.
    size = max(value.numel() for value in values)
    # Not Keras variables: kept out of Keras's attribute tracking.
    buffers = optimizer.__dict__.setdefault("_torch_scratch", {})
    scratch = buffers.get((dtype, device))
    if scratch is None or scratch.numel() < size:
        scratch = torch.empty(size, dtype=dtype, device=device)
        buffers[(dtype, device)] = scratch
    for grad, value, m, v in zip(
        grads, values, moments, velocities, strict=True
    ):
        m.lerp_(grad, 1 - optimizer.beta_1)
        v.mul_(optimizer.beta_2).addcmul_(
            grad, grad, value=1 - optimizer.beta_2
        )
        update = scratch[: v.numel()].view_as(v)
        torch.sqrt(v, out=update).add_(optimizer.epsilon)
        torch.div(m, update, out=update)
        value.sub_(update.mul_(alpha))


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
