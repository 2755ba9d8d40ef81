import keras
from keras import ops

from keras_transformer import backends


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross entropy against label-smoothed targets (section 5.4).

    The target distribution puts ``1 - label_smoothing`` on the reference
    token and spreads ``label_smoothing`` uniformly over the whole
    vocabulary (Szegedy et al., 2016, as the paper cites), so per token

    ``loss = (1 - eps) * -log p(y) + eps * mean_k(-log p(k))``.

    Padding is ignored: positions whose label is ``pad_id`` weigh nothing,
    and the loss is averaged over real tokens only (the sum of the sample
    weights), not over the padded batch. A ``sample_weight`` from the
    pipeline (0 on padding) gives the same result. A label outside
    ``[0, vocabulary_size)`` raises on TensorFlow (outside XLA) and makes
    the loss NaN elsewhere.

    Args:
        label_smoothing: eps_ls, 0.1 in the paper.
        pad_id: label id to ignore, or None to count every position.
        from_logits: whether predictions are logits (the model's output)
            or probabilities.

    Call arguments:
        y_true: int labels ``(batch, length)``.
        y_pred: ``(batch, length, vocabulary_size)``.
        sample_weight: optional ``(batch, length)`` weights.
    """

    def __init__(
        self,
        label_smoothing=0.1,
        pad_id=0,
        from_logits=True,
        name="label_smoothed_cross_entropy",
        **kwargs,
    ):
        kwargs.setdefault("reduction", "mean_with_sample_weight")
        super().__init__(name=name, **kwargs)
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ValueError(
                f"label_smoothing={label_smoothing} must be in [0, 1)."
            )
        self.label_smoothing = float(label_smoothing)
        self.pad_id = pad_id
        self.from_logits = bool(from_logits)

    def __call__(self, y_true, y_pred, sample_weight=None):
        if self.pad_id is not None:
            real = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
            sample_weight = (
                real
                if sample_weight is None
                else ops.cast(sample_weight, "float32") * real
            )
        return super().__call__(y_true, y_pred, sample_weight=sample_weight)

    def call(self, y_true, y_pred):
        y_pred = ops.cast(y_pred, "float32")
        labels = ops.cast(y_true, "int32")
        if self.from_logits:
            return _smoothed_cross_entropy(labels, y_pred, self.label_smoothing)
        log_probs = ops.log(ops.clip(y_pred, 1e-12, 1.0))
        nll = -ops.squeeze(
            ops.take_along_axis(log_probs, labels[..., None], axis=-1), -1
        )
        if self.label_smoothing == 0.0:
            return nll
        smooth = -ops.mean(log_probs, axis=-1)
        eps = self.label_smoothing
        return (1.0 - eps) * nll + eps * smooth

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "label_smoothing": self.label_smoothing,
                "pad_id": self.pad_id,
                "from_logits": self.from_logits,
            }
        )
        return config


def _smoothed_cross_entropy(labels, logits, eps):
    """Per-token label-smoothed cross entropy from float32 logits.

    With ``lse = logsumexp(z)`` and ``-log p(k) = lse - z_k`` the loss is
    ``lse - (1 - eps) * z_y - eps * mean_k(z_k)``: no log-softmax over
    the vocabulary is kept for the backward pass. XLA fuses it on JAX;
    on TensorFlow the ``fused_loss`` fast path computes it with its
    fused kernel (`keras_transformer.backends.losses`).
    """
    fused = backends.smoothed_cross_entropy_function()
    if fused is not None:
        return fused(labels, logits, eps)
    lse = ops.logsumexp(logits, axis=-1)
    reference = ops.squeeze(
        ops.take_along_axis(logits, labels[..., None], axis=-1), -1
    )
    # A compiled JAX step cannot raise: a label outside the vocabulary
    # (which take_along_axis would wrap or clip) makes the loss NaN.
    inside = ops.logical_and(labels >= 0, labels < ops.shape(logits)[-1])
    reference = ops.where(inside, reference, float("nan"))
    loss = lse - (1.0 - eps) * reference
    if eps:
        loss = loss - eps * ops.mean(logits, axis=-1)
    return loss
