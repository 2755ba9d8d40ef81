"""`Adam`: Keras's Adam, with a faster update on torch."""

import keras


@keras.saving.register_keras_serializable(package="keras_transformer")
class Adam(keras.optimizers.Adam):
    """`keras.optimizers.Adam`, with the same update, faster on torch.

    On the torch backend Keras updates all variables together, one
    ``torch._foreach_*`` operation at a time, with a new temporary for
    each intermediate: every operation streams all parameters, moments
    and temporaries through memory before the next starts. Here each
    variable is updated in turn by torch's in-place kernels (``lerp_``,
    ``addcmul_``) and one reused scratch buffer, so its moments stay in
    the CPU's cache across its update, as in `torch.optim.Adam` (the
    README's "Speed" section has the measured gain).

    The arithmetic is Keras's, ``alpha = lr * sqrt(1 - beta_2^t) / (1 -
    beta_1^t)`` and ``var -= alpha * m / (sqrt(v) + epsilon)``, and so
    are the slots, so checkpoints move freely between this class and
    `keras.optimizers.Adam`. Other backends, ``amsgrad=True`` and
    everything around the update (gradient accumulation, clipping, loss
    scaling, EMA) run Keras's own code.

    Example:
    >>> optimizer = Adam(1e-3, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    """

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if keras.backend.backend() != "torch" or self.amsgrad:
            return super()._backend_update_step(
                grads, trainable_variables, learning_rate
            )
        import torch

        with torch.no_grad():
            self._torch_update_step(grads, trainable_variables, learning_rate)

    def _torch_update_step(self, grads, trainable_variables, learning_rate):
        import torch

        values = [variable.value for variable in trainable_variables]
        dtype, device = values[0].dtype, values[0].device
        lr = keras.ops.convert_to_tensor(learning_rate).to(dtype)
        step = keras.ops.convert_to_tensor(self.iterations + 1).to(dtype)
        alpha = lr * torch.sqrt(1 - self.beta_2**step) / (1 - self.beta_1**step)
        # One buffer for every variable's ``sqrt(v) + epsilon``: a new
        # tensor per variable and step costs the allocator page faults.
        size = max(value.numel() for value in values)
        scratch = self.__dict__.get("_torch_scratch")
        if scratch is None or scratch.numel() < size or scratch.dtype != dtype:
            scratch = torch.empty(size, dtype=dtype, device=device)
            # Not a Keras variable: kept out of Keras's attribute tracking.
            self.__dict__["_torch_scratch"] = scratch
        for grad, variable, value in zip(
            grads, trainable_variables, values, strict=True
        ):
            index = self._get_variable_index(variable)
            m = self._momentums[index].value
            v = self._velocities[index].value
            grad = grad.to(value.dtype)
            m.lerp_(grad, 1 - self.beta_1)
            v.mul_(self.beta_2).addcmul_(grad, grad, value=1 - self.beta_2)
            update = scratch[: v.numel()].view_as(v)
            torch.sqrt(v, out=update).add_(self.epsilon)
            torch.div(m, update, out=update)
            value.sub_(update.mul_(alpha))
