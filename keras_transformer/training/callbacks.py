"""Callbacks of the training recipes."""

import math
import numbers
import os
import time

import keras


class TimeLimit(keras.callbacks.Callback):
    """Stops training so that it ends within ``max_minutes`` of wall-clock
    time. Time spent before `fit` started (e.g. in an earlier, resumed
    run) is not counted.

    The work at the end of an epoch (saving the training state, validation)
    runs also when training stops, so the callback measures it along with
    the batches: after each batch it stops unless one more batch, any epoch
    end due before it, and the final epoch end still fit in the limit.

    Args:
        max_minutes: the limit, a positive number, or None for none.
        clock: a function returning the time in seconds
            (`time.monotonic`; a test passes its own).
    """

    def __init__(self, max_minutes, clock=time.monotonic):
        super().__init__()
        if max_minutes is not None and (
            not isinstance(max_minutes, numbers.Real)
            or isinstance(max_minutes, bool)
            or not math.isfinite(max_minutes)
            or max_minutes <= 0
        ):
            raise ValueError(
                f"max_minutes={max_minutes!r} must be a positive number "
                "of minutes, or None for no limit."
            )
        self.max_minutes = max_minutes
        self.clock = clock
        self.stopped = False
        self.epoch_end_seconds = 0.0
        self.batch_seconds = 0.0

    def on_train_begin(self, logs=None):
        self._start = self.clock()
        self._last_batch_end = None

    def on_epoch_begin(self, epoch, logs=None):
        # The pause since the last batch: the epoch-end callbacks' work.
        if self._last_batch_end is not None:
            pause = self.clock() - self._last_batch_end
            self.epoch_end_seconds = max(self.epoch_end_seconds, pause)

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_start = self.clock()

    def on_train_batch_end(self, batch, logs=None):
        self._last_batch_end = now = self.clock()
        # The first batches compile or warm up: the latest one is the
        # estimate for the next.
        self.batch_seconds = now - self._batch_start
        if self.max_minutes is None:
            return
        needed = self.batch_seconds + self.epoch_end_seconds
        if batch + 1 == (self.params or {}).get("steps"):
            needed += self.epoch_end_seconds  # this epoch's end comes first
        if now - self._start + needed > 60.0 * self.max_minutes:
            self.stopped = True
            self.model.stop_training = True


class LearningRateLogger(keras.callbacks.Callback):
    """Adds ``learning_rate``, the optimizer's rate at the end of each
    epoch (a schedule's value at the current step), to the epoch logs,
    so that `keras.callbacks.CSVLogger` and `TensorBoard`, placed after
    it, record it."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            rate = self.model.optimizer.learning_rate
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(rate))


class BleuCallback(keras.callbacks.Callback):
    """Translates a validation subset at the end of each epoch, adds
    ``val_bleu`` to the logs (so `keras.callbacks.CSVLogger` and
    `TensorBoard`, placed after it, record it) and keeps the weights of
    the best epoch in ``best_path``.

    Args:
        tokenizer: the model's tokenizer.
        sources, references: the validation subset, lists of str.
        best_path: where to save the best weights
            (``*.weights.h5``), or None.
        every: translate every this many epochs.
        **settings: generation settings, e.g. ``beam_size=1`` for a
            quicker greedy estimate during training.
    """

    def __init__(
        self,
        tokenizer,
        sources,
        references,
        best_path=None,
        every=1,
        **settings,
    ):
        super().__init__()
        if len(sources) != len(references):
            raise ValueError(
                f"There are {len(sources)} sources but {len(references)} "
                "references; they must align."
            )
        self.tokenizer = tokenizer
        self.sources = list(sources)
        self.references = list(references)
        self.best_path = best_path
        self.every = int(every)
        self.settings = settings
        self.best = None
        self.history = []

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every:
            return
        from keras_transformer.generation import Translator, evaluate_bleu

        translator = Translator(self.model, self.tokenizer, **self.settings)
        result = evaluate_bleu(
            translator, self.sources, self.references, verbose=False
        )
        self.history.append((epoch, result.score))
        if logs is not None:
            logs["val_bleu"] = result.score
        if self.best is None or result.score > self.best:
            self.best = result.score
            if self.best_path:
                os.makedirs(
                    os.path.dirname(self.best_path) or ".", exist_ok=True
                )
                self.model.save_weights(self.best_path, overwrite=True)
