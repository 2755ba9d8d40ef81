import keras
from keras import ops


class _MaskedTokenMetric(keras.metrics.Metric):
    """A mean over real (non-padding) tokens, weighted by sample weights."""

    def __init__(self, pad_id=0, name=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.total = self.add_variable((), "zeros", name="total")
        self.count = self.add_variable((), "zeros", name="count")

    def _per_token(self, y_true, y_pred):
        raise NotImplementedError

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        weight = ops.ones(ops.shape(y_true), "float32")
        if self.pad_id is not None:
            weight = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        if sample_weight is not None:
            weight = weight * ops.cast(sample_weight, "float32")
        values = self._per_token(y_true, ops.cast(y_pred, "float32"))
        self.total.assign_add(ops.sum(values * weight))
        self.count.assign_add(ops.sum(weight))

    def _mean(self):
        return ops.divide_no_nan(self.total, self.count)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(_MaskedTokenMetric):
    """Next-token accuracy over real tokens (labels other than ``pad_id``
    and with nonzero sample weight)."""

    def __init__(self, pad_id=0, name="token_accuracy", **kwargs):
        super().__init__(pad_id=pad_id, name=name, **kwargs)

    def _per_token(self, y_true, y_pred):
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        return ops.cast(ops.equal(predicted, y_true), "float32")

    def result(self):
        return self._mean()


@keras.saving.register_keras_serializable(package="keras_transformer")
class Perplexity(_MaskedTokenMetric):
    """``exp`` of the mean negative log-likelihood of real tokens, without
    label smoothing, from logits."""

    def __init__(self, pad_id=0, name="perplexity", **kwargs):
        super().__init__(pad_id=pad_id, name=name, **kwargs)

    def _per_token(self, y_true, y_pred):
        log_probs = ops.log_softmax(y_pred, axis=-1)
        picked = ops.take_along_axis(log_probs, y_true[..., None], axis=-1)
        return -ops.squeeze(picked, -1)

    def result(self):
        return ops.exp(self._mean())
