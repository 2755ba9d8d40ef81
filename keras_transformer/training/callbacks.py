"""Callbacks of the training recipes."""

import math
import numbers
import os
import time

import keras

from keras_transformer.training.checkpoints import save_weights


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
        self._translator = None

    def _translator_of_model(self):
        """One `Translator` of the model for every epoch: its compiled
        searches read the model's current weights, and are compiled only
        once."""
        from keras_transformer.generation import Translator

        if self._translator is None or self._translator.model is not self.model:
            self._translator = Translator(
                self.model, self.tokenizer, **self.settings
            )
        return self._translator

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every:
            return
        from keras_transformer.generation import evaluate_bleu

        result = evaluate_bleu(
            self._translator_of_model(),
            self.sources,
            self.references,
            verbose=False,
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
                save_weights(self.model, self.best_path)


class KeepBest(keras.callbacks.Callback):
    """Keeps the weights of the epoch with the best value of a monitored
    log in ``path`` and, with a ``patience``, stops training once that
    value has not improved for ``patience`` epochs (early stopping).

    Place it after the callbacks that add the monitored value to the
    logs (`BleuCallback` adds ``val_bleu``; ``val_loss`` comes from
    ``fit(validation_data=...)``). Only a strictly better value counts
    as an improvement, so the first of equal epochs stays the best. A
    run resumed after ``history`` (the values of its earlier epochs)
    goes on with their best and their epochs without improvement.

    Args:
        path: where to save the best weights (``*.weights.h5``).
        monitor: the key of the epoch logs to watch.
        mode: ``"max"`` (BLEU) or ``"min"`` (a loss).
        patience: epochs without improvement before training stops; 0
            never stops.
        history: ``(epoch, value)`` of the epochs already trained, in
            order.

    Attributes:
        best, best_epoch: the best value and its epoch (from 0, as
            `keras.callbacks.CSVLogger` numbers epochs), or None.
        stopped_early: training stopped (or, resumed, had stopped) for
            want of improvement.
    """

    def __init__(self, path, monitor, mode, patience=0, history=()):
        super().__init__()
        if mode not in ("max", "min"):
            raise ValueError(f"mode={mode!r} must be 'max' or 'min'.")
        if not isinstance(patience, int) or patience < 0:
            raise ValueError(
                f"patience={patience!r} must be 0 (never stop) or a "
                "positive number of epochs."
            )
        self.path = str(path)
        self.monitor = monitor
        self.mode = mode
        self.patience = patience
        self.best = self.best_epoch = None
        self.wait = 0
        for epoch, value in history:
            self._update(epoch, value)
        self.stopped_early = self.exhausted

    @property
    def exhausted(self):
        """The patience has run out: no epoch should follow."""
        return self.patience > 0 and self.wait >= self.patience

    def _update(self, epoch, value):
        """Records an epoch's value; returns whether it is a new best."""
        better = self.best is None or (
            value > self.best if self.mode == "max" else value < self.best
        )
        if better and math.isfinite(value):
            self.best, self.best_epoch, self.wait = value, epoch, 0
            return True
        self.wait += 1
        return False

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None:
            raise ValueError(
                f"KeepBest monitors {self.monitor!r}, which the epoch logs "
                f"do not have ({sorted(logs or {})}); place it after the "
                "callback that adds it."
            )
        if self._update(epoch, float(value)):
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            save_weights(self.model, self.path)
        if self.exhausted:
            self.stopped_early = True
            self.model.stop_training = True
