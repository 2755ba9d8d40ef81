import keras
from keras import ops

from keras_transformer.training.optimizers import Adam


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The learning rate of section 5.3.

    ``lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)``:
    a linear warm-up for ``warmup_steps`` steps, then decay proportional to
    the inverse square root of the step. Steps count from 1, so the
    optimizer's ``iterations`` (which count from 0) are shifted by one.

    Args:
        hidden_dim: d_model.
        warmup_steps: 4000 in the paper.
        scale: a constant factor on the whole schedule (1 in the paper;
            fairseq and tensor2tensor expose it for other batch sizes).
        total_steps, cooldown_steps: optionally, a linear cool-down (not
            in the paper): over the last ``cooldown_steps`` of
            ``total_steps`` the rate falls linearly towards 0, reaching
            ``1 / cooldown_steps`` of the paper's rate at the last step.
            For a fixed budget of steps, a run that ends cooled down
            trains better than one that stops on the decay. The default
            (0) is the paper's schedule.

    Example:
    >>> schedule = TransformerSchedule(512)
    >>> optimizer = keras.optimizers.Adam(schedule, 0.9, 0.98, 1e-9)
    """

    def __init__(
        self,
        hidden_dim,
        warmup_steps=4000,
        scale=1.0,
        total_steps=None,
        cooldown_steps=0,
    ):
        if int(hidden_dim) < 1:
            raise ValueError(f"hidden_dim={hidden_dim} must be positive.")
        if int(warmup_steps) < 1:
            raise ValueError(
                f"warmup_steps={warmup_steps} must be a positive integer."
            )
        self.hidden_dim = int(hidden_dim)
        self.warmup_steps = int(warmup_steps)
        self.scale = float(scale)
        if int(cooldown_steps) < 0:
            raise ValueError(
                f"cooldown_steps={cooldown_steps} must be 0 (no cool-down) "
                "or positive."
            )
        if cooldown_steps and (total_steps is None or int(total_steps) < 1):
            raise ValueError(
                f"total_steps={total_steps}: a cool-down of "
                f"cooldown_steps={cooldown_steps} needs the positive number "
                "of steps it ends at."
            )
        self.total_steps = None if total_steps is None else int(total_steps)
        self.cooldown_steps = int(cooldown_steps)

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        decay = ops.power(step, -0.5)
        warmup = step * self.warmup_steps**-1.5
        rate = self.scale * self.hidden_dim**-0.5 * ops.minimum(decay, warmup)
        if self.cooldown_steps:
            left = (self.total_steps + 1.0 - step) / self.cooldown_steps
            rate = rate * ops.clip(left, 0.0, 1.0)
        return rate

    def get_config(self):
        return {
            "hidden_dim": self.hidden_dim,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
            "total_steps": self.total_steps,
            "cooldown_steps": self.cooldown_steps,
        }


def fit_schedule(warmup_steps, cooldown_steps, total_steps):
    """The warm-up and cool-down of a run of ``total_steps`` optimizer
    steps, as ``(warmup_steps, cooldown_steps)``.

    Unchanged when they fit in the run. A shorter run (a smoke test of a
    few steps) would otherwise spend all of it warming up, or cooling
    down from a rate that never rose: both are then scaled by
    ``total_steps / (warmup_steps + cooldown_steps)`` (rounded, at least
    one warm-up step, a cool-down of at least one step when there was
    one), so that the rate still rises to its peak and falls to the end.

    Example:
    >>> fit_schedule(400, 575, 20)
    (8, 12)
    """
    for name, value, minimum in (
        ("warmup_steps", warmup_steps, 1),
        ("cooldown_steps", cooldown_steps, 0),
        ("total_steps", total_steps, 1),
    ):
        if isinstance(value, bool) or int(value) != value or value < minimum:
            raise ValueError(
                f"{name}={value!r} must be an integer of at least {minimum}."
            )
    warmup_steps, cooldown_steps = int(warmup_steps), int(cooldown_steps)
    if warmup_steps + cooldown_steps <= total_steps:
        return warmup_steps, cooldown_steps
    factor = total_steps / (warmup_steps + cooldown_steps)
    warmup = max(1, round(warmup_steps * factor))
    cooldown = min(total_steps, round(cooldown_steps * factor))
    if cooldown_steps:
        cooldown = max(1, cooldown)
    return warmup, cooldown


def transformer_optimizer(
    hidden_dim,
    warmup_steps=4000,
    scale=1.0,
    gradient_accumulation_steps=None,
    total_steps=None,
    cooldown_steps=0,
    **kwargs,
):
    """Adam with beta_1 = 0.9, beta_2 = 0.98, epsilon = 1e-9 and the
    schedule of section 5.3.

    ``gradient_accumulation_steps`` sums gradients over that many batches
    before each update (Keras' own accumulation), so a small machine can
    reach the paper's 25,000-token batches; the schedule then counts
    updates, not batches, and so do ``total_steps`` and ``cooldown_steps``
    (see `TransformerSchedule`). Other keyword arguments go to
    `keras.optimizers.Adam` (e.g. ``clipnorm``).

    The optimizer is `keras_transformer.training.optimizers.Adam`: Keras's
    Adam, with the same update and slots, faster on TensorFlow and
    torch.
    """
    return Adam(
        learning_rate=TransformerSchedule(
            hidden_dim, warmup_steps, scale, total_steps, cooldown_steps
        ),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        gradient_accumulation_steps=gradient_accumulation_steps,
        **kwargs,
    )
