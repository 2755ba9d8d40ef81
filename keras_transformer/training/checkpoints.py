"""Checkpoint averaging (section 6.1) and resumable training."""

import glob
import math
import os

import keras
import numpy as np

from keras_transformer import backends
from keras_transformer.distribute import whole_copy
from keras_transformer.io_utils import read_json, write_json

CHECKPOINT_PATTERN = "step-{step:08d}.weights.h5"
STATE_WEIGHTS = "training_state.weights.h5"
STATE_JSON = "training_state.json"


def save_weights(model, path):
    """``model.save_weights(path)``, whole in a run whose weights are split
    over several hosts (`whole_copy`), where every process calls it at
    the same point."""
    optimizer = getattr(model, "optimizer", None) is not None
    whole_copy(model, optimizer).save_weights(path, overwrite=True)


def _step(model):
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


class KeepLastCheckpoints(keras.callbacks.Callback):
    """Saves the model's weights every ``save_every`` optimizer steps (or at
    the end of each epoch) and keeps only the newest ``keep`` files, ready
    for `average_checkpoints`. The paper averages the last 5 checkpoints of
    the base model and the last 20 of the big one, written at 10-minute
    intervals.

    Files are named ``step-00012000.weights.h5`` after the optimizer step.
    When training ends between two saves (a time limit, a step budget that
    is not a multiple of ``save_every``), the final weights are saved too,
    so that the last checkpoint is always the end of training.

    Args:
        directory: where to write the checkpoints.
        keep: how many to keep.
        save_every: ``"epoch"`` or a number of optimizer steps.
    """

    def __init__(self, directory, keep=5, save_every="epoch"):
        super().__init__()
        if int(keep) < 1:
            raise ValueError(f"keep={keep} must be a positive integer.")
        if save_every != "epoch" and (
            not isinstance(save_every, int) or save_every < 1
        ):
            raise ValueError(
                f"save_every={save_every!r} must be 'epoch' or a positive "
                "number of steps."
            )
        self.directory = str(directory)
        self.keep = int(keep)
        self.save_every = save_every

    def on_train_batch_end(self, batch, logs=None):
        if self.save_every != "epoch":
            step = _step(self.model)
            if step % self.save_every == 0:
                self._save(step)

    def on_epoch_end(self, epoch, logs=None):
        if self.save_every == "epoch":
            self._save(_step(self.model))

    def on_train_end(self, logs=None):
        step = _step(self.model)
        if self.save_every != "epoch" and step % self.save_every:
            self._save(step)

    def _save(self, step):
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(
            self.directory, CHECKPOINT_PATTERN.format(step=step)
        )
        save_weights(self.model, path)
        for old in list_checkpoints(self.directory)[: -self.keep]:
            os.remove(old)


def list_checkpoints(directory):
    """The checkpoints `KeepLastCheckpoints` wrote, oldest first."""
    return sorted(glob.glob(os.path.join(directory, "step-*.weights.h5")))


def average_checkpoints(model, paths):
    """Sets ``model``'s weights to the mean of the checkpoints at ``paths``.

    Every checkpoint must come from a model of the same configuration.
    The mean is taken in float64 and cast back to each variable's dtype.
    Optimizer state in the files is ignored. Returns ``model``.
    """
    paths = [str(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint.")
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"Checkpoint not found: {path}")
    # Load into a fresh copy without an optimizer, so the files' optimizer
    # variables are not required to match.
    scratch = model.__class__.from_config(model.get_config())
    total = None
    for path in paths:
        scratch.load_weights(path, skip_mismatch=False)
        values = [
            keras.ops.convert_to_numpy(w).astype("float64")
            for w in scratch.weights
        ]
        total = (
            values
            if total is None
            else [t + v for t, v in zip(total, values, strict=True)]
        )
    model.set_weights(
        [
            (t / len(paths)).astype(keras.backend.standardize_dtype(w.dtype))
            for t, w in zip(total, model.weights, strict=True)
        ]
    )
    return model


class ResumableCheckpoint(keras.callbacks.Callback):
    """Writes the full training state at the end of every epoch: model and
    optimizer variables (``training_state.weights.h5``, written first to a
    temporary file and then renamed, so a kill mid-write leaves the last
    good state) and the optimizer step (``training_state.json``).

    Use it through `fit_resumable`, which restores the state and skips the
    batches already seen. ``steps_per_epoch`` counts optimizer steps.
    """

    def __init__(self, directory, steps_per_epoch, global_random_state=None):
        super().__init__()
        self.directory = str(directory)
        self.steps_per_epoch = int(steps_per_epoch)
        self.global_random_state = global_random_state

    def on_train_batch_begin(self, batch, logs=None):
        # Restored just before the first step, not before `fit`: fit's own
        # set-up and first call draw from the global generator.
        if self.global_random_state is not None:
            backends.set_global_rng_state(self.global_random_state)
            self.global_random_state = None

    def on_epoch_end(self, epoch, logs=None):
        # An epoch cut short (a time limit, early stopping) is not saved:
        # resuming from a whole epoch keeps the run identical to one that
        # was never interrupted.
        if _step(self.model) == (epoch + 1) * self.steps_per_epoch:
            save_training_state(self.model, self.directory, epoch=epoch + 1)


def save_training_state(model, directory, epoch):
    os.makedirs(directory, exist_ok=True)
    weights = os.path.join(directory, STATE_WEIGHTS)
    temporary = os.path.join(directory, "partial." + STATE_WEIGHTS)
    save_weights(model, temporary)
    os.replace(temporary, weights)
    state = {
        "step": _step(model),
        "epoch": int(epoch),
        "random_states": [
            keras.ops.convert_to_numpy(v).tolist()
            for v in _random_states(model)
        ],
        "global_random_state": backends.global_rng_state(),
    }
    write_json(os.path.join(directory, STATE_JSON), state, indent=None)


def _random_states(model):
    """The states of the dropout layers' random generators.

    `save_weights` leaves them out, yet a resumed run needs them to draw the
    dropout masks an uninterrupted run would have drawn. They are the
    model's variables that are not weights, in creation order (their
    auto-generated names differ between processes, the order does not).
    """
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def saved_epoch(directory):
    """The number of epochs whose training state `ResumableCheckpoint`
    saved in ``directory`` (0 when none): a run started again resumes
    after them."""
    path = os.path.join(directory, STATE_JSON)
    if not os.path.exists(path):
        return 0
    return int(read_json(path)["epoch"])


def restore_training_state(model, directory):
    """Loads the state `ResumableCheckpoint` saved into a compiled
    ``model``; returns ``{"step": ..., "epoch": ...}``, or step and epoch 0
    when there is nothing to restore."""
    path = os.path.join(directory, STATE_JSON)
    if not os.path.exists(path):
        return {"step": 0, "epoch": 0}
    if model.optimizer is None:
        raise ValueError(
            "restore_training_state needs a compiled model: call "
            "model.compile(...) before resuming."
        )
    state = read_json(path)
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.load_weights(os.path.join(directory, STATE_WEIGHTS))
    random_states = _random_states(model)
    if len(random_states) != len(state.get("random_states", [])):
        raise ValueError(
            f"The training state in {directory} was saved from a model with "
            f"{len(state.get('random_states', []))} random generators; this "
            f"one has {len(random_states)}. Resume with the same model "
            "configuration, or delete the directory to start afresh."
        )
    for variable, value in zip(
        random_states, state["random_states"], strict=True
    ):
        variable.assign(np.asarray(value, dtype=variable.dtype))
    if _step(model) != state["step"]:
        raise ValueError(
            f"The training state in {directory} is inconsistent: the "
            f"optimizer step is {_step(model)} but {STATE_JSON} says "
            f"{state['step']}. Delete the directory to start afresh."
        )
    return state


def fit_resumable(
    model,
    dataset,
    total_steps,
    steps_per_epoch,
    directory,
    callbacks=(),
    fit_input=None,
    restore_from=None,
    **fit_kwargs,
):
    """`model.fit` that survives being killed and continues where it was.

    ``dataset`` must be a repeated, deterministic `tf.data.Dataset` (the
    pipeline's ``repeat=True`` with a seed, and ``deterministic=True`` for
    bit-exact resumption). Training runs in epochs of ``steps_per_epoch``
    optimizer steps up to ``total_steps`` (rounded up to whole epochs); the
    full state is saved after each. Started again with the same arguments,
    it restores the model, optimizer and schedule step, skips the batches
    already consumed and goes on, ending with the weights an uninterrupted
    run would have.

    ``restore_from`` is the directory to restore from when it is not
    ``directory`` (the other processes of a distributed run restore the
    first one's state). ``fit_input``, when given, turns the
    dataset (with the consumed batches skipped) into what ``fit`` reads
    (`Distribution.fit_input`).

    Returns the `History` of this call, or None if training had finished.
    """
    state = restore_training_state(model, restore_from or directory)
    batches_per_step = (
        getattr(model.optimizer, "gradient_accumulation_steps", None) or 1
    )
    epochs = math.ceil(total_steps / steps_per_epoch)
    if state["epoch"] >= epochs:
        return None
    skip = state["epoch"] * steps_per_epoch * batches_per_step
    if skip:
        dataset = dataset.skip(skip)
    if fit_input is not None:
        dataset = fit_input(dataset)
    return model.fit(
        dataset,
        epochs=epochs,
        initial_epoch=state["epoch"],
        steps_per_epoch=steps_per_epoch * batches_per_step,
        callbacks=[
            ResumableCheckpoint(
                directory,
                steps_per_epoch,
                state.get("global_random_state"),
            ),
            *callbacks,
        ],
        **fit_kwargs,
    )


__all__ = [
    "KeepLastCheckpoints",
    "ResumableCheckpoint",
    "average_checkpoints",
    "fit_resumable",
    "list_checkpoints",
    "restore_training_state",
    "save_training_state",
    "saved_epoch",
]
