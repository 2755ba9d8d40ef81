"""The ``fused_loss`` fast path: label-smoothed cross-entropy (Szegedy
et al., 2016; Vaswani et al., 2017, 5.4) by TensorFlow's fused
``softmax_cross_entropy_with_logits`` on the smoothed targets."""

import tensorflow as tf


def smoothed_cross_entropy(labels, logits, eps):
    """Per-token label-smoothed cross-entropy of float32 ``logits``
    ``(..., vocabulary)`` for int ``labels`` ``(...)``."""
    vocabulary = tf.shape(logits)[-1]
    # A label outside the vocabulary would make a one-hot row of zeros
    # (a wrong loss, no error); Keras's formula gives NaN. XLA drops the
    # check, as it drops every assertion.
    tf.debugging.assert_less(
        labels,
        vocabulary,
        message="LabelSmoothedCrossEntropy: labels must be below the "
        "vocabulary size (the last axis of the logits); check that the "
        "labels and the model's vocabulary_size match",
    )
    tf.debugging.assert_non_negative(
        labels,
        message="LabelSmoothedCrossEntropy: labels must not be negative",
    )
    off = eps / tf.cast(vocabulary, "float32")
    targets = tf.one_hot(
        labels, vocabulary, on_value=1.0 - eps + off, off_value=off
    )
    return tf.nn.softmax_cross_entropy_with_logits(targets, logits)
