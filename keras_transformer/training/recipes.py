"""The training recipes: the paper's recipe with each dataset's settings,
run end to end (tokenizer, pipeline, `model.fit`, checkpoint averaging,
BLEU on the test set, a saved translator)."""

import contextlib
import csv
import dataclasses
import inspect
import math
import numbers
import os
import time

import keras

from keras_transformer.io_utils import write_json
from keras_transformer.models import Transformer
from keras_transformer.models.configs import get_config
from keras_transformer.training.run_directory import (
    RunInterrupted,
    check_output,
    run_fingerprint,
)
from keras_transformer.training.schedule import fit_schedule
from keras_transformer.utils import describe, replace_settings

RESULTS_FILE = "results.json"
# The weights of the best validated epoch, in the checkpoints directory.
BEST_WEIGHTS = "best.weights.h5"
TRAINING_LOG = "training.csv"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything that defines a training run but the data location.

    Attributes:
        name: the recipe's name.
        dataset, train_split, valid_split, test_split: the corpus, as
            `keras_transformer.data.load_dataset` names it.
        vocabulary_size: size of the shared subword vocabulary.
        model: `Transformer` arguments.
        max_tokens: token budget of a batch, per side.
        batch_multiple: every batch's sentence count is a multiple of
            this (and of a distributed run's replica count): a run on one
            device with the replica count of a distributed run trains on
            the same global batches as that run.
        max_length: the longest training sequence (and the model's
            ``max_sequence_length``).
        warmup_steps, learning_rate_scale: the schedule of section 5.3.
        cooldown_steps: a linear cool-down of the rate to 0 over the last
            this many of ``max_steps`` (0, the paper's schedule, for
            none; see `TransformerSchedule`).
        label_smoothing: eps_ls of section 5.4.
        max_steps: optimizer steps to train for.
        steps_per_epoch: steps between saved training states (the unit
            of resumption and of logging).
        checkpoint_every, average_last: a checkpoint every this many steps,
            and the last ones averaged at the end (section 6.1).
        gradient_accumulation_steps: batches summed into one update.
        beam_size, length_penalty: decoding for evaluation (section 6.1).
        bleu_subset: validation sentences translated after each epoch
            (0 to skip); their BLEU is ``val_bleu``.
        validation_batches: batches of the validation split (the
            training pipeline's, in corpus order) on which the loss and
            metrics are computed, teacher-forced, after each epoch:
            ``val_loss``, ``val_token_accuracy``, ``val_perplexity``
            (0 to skip).
        early_stopping_patience: stop when the monitored validation
            value (``val_bleu`` with a ``bleu_subset``, else
            ``val_loss``) has not improved for this many epochs (0: never
            stop early). The best epoch's weights are kept either way.
        peak_learning_rate: when set, the schedule's rate at the end of
            the warm-up (``learning_rate_scale`` must then stay 1); None
            for section 5.3's rate times ``learning_rate_scale``.
        fine_tune: the recipe fine-tunes a trained model (``init`` of
            `run_recipe`) rather than training one from scratch.
        dtype: the dtype policy, e.g. ``"mixed_bfloat16"``.
    """

    name: str
    dataset: str
    train_split: str
    valid_split: str
    test_split: str
    vocabulary_size: int
    model: dict
    max_tokens: int
    batch_multiple: int = 1
    max_length: int = 256
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
    cooldown_steps: int = 0
    label_smoothing: float = 0.1
    max_steps: int = 100_000
    steps_per_epoch: int = 1000
    checkpoint_every: int = 1000
    average_last: int = 5
    gradient_accumulation_steps: int | None = None
    beam_size: int = 4
    length_penalty: float = 0.6
    bleu_subset: int = 200
    validation_batches: int = 20
    early_stopping_patience: int = 0
    peak_learning_rate: float | None = None
    fine_tune: bool = False
    dtype: str = "float32"

    def __post_init__(self):
        _check_recipe(self)

    def replace(self, **overrides):
        return replace_settings(self, overrides, "recipe settings")


# Each setting's default: what a run recorded before the setting existed
# trained with.
_DEFAULTS = {
    field.name: field.default
    for field in dataclasses.fields(Recipe)
    if field.default is not dataclasses.MISSING
}
# The least value of each integer setting.
_INTEGER_SETTINGS = {
    "vocabulary_size": 8,  # 4 ids are reserved
    "max_tokens": 1,
    "batch_multiple": 1,
    "max_length": 2,  # a token and the start or end id
    "warmup_steps": 1,
    "cooldown_steps": 0,
    "max_steps": 1,
    "steps_per_epoch": 1,
    "checkpoint_every": 1,
    "average_last": 1,
    "beam_size": 1,
    "bleu_subset": 0,
    "validation_batches": 0,
    "early_stopping_patience": 0,
}
_TEXT_SETTINGS = (
    "name",
    "dataset",
    "train_split",
    "valid_split",
    "test_split",
    "dtype",
)


def _is_integer(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value):
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def _setting_error(key, value, wanted):
    return ValueError(
        f"Recipe setting {key}={describe(value)} must be {wanted}."
    )


def _check_recipe(recipe):
    """Raises a ValueError naming the first setting of the wrong type or
    out of range, with its value: before any work, instead of an error
    deep inside training."""
    for key in _TEXT_SETTINGS:
        value = getattr(recipe, key)
        if not isinstance(value, str) or not value:
            raise _setting_error(key, value, "a non-empty string")
    for key, least in _INTEGER_SETTINGS.items():
        value = getattr(recipe, key)
        if not _is_integer(value) or value < least:
            raise _setting_error(key, value, f"an integer of at least {least}")
    accumulation = recipe.gradient_accumulation_steps
    if accumulation is not None and (
        not _is_integer(accumulation) or accumulation < 1
    ):
        raise _setting_error(
            "gradient_accumulation_steps",
            accumulation,
            "None or an integer of at least 1",
        )
    if not _is_number(recipe.learning_rate_scale) or (
        recipe.learning_rate_scale <= 0
    ):
        raise _setting_error(
            "learning_rate_scale",
            recipe.learning_rate_scale,
            "a positive, finite number",
        )
    if not _is_number(recipe.label_smoothing) or not (
        0 <= recipe.label_smoothing < 1
    ):
        raise _setting_error(
            "label_smoothing", recipe.label_smoothing, "a number in [0, 1)"
        )
    if not _is_number(recipe.length_penalty):
        raise _setting_error(
            "length_penalty", recipe.length_penalty, "a finite number"
        )
    if not isinstance(recipe.model, dict) or not all(
        isinstance(key, str) for key in recipe.model
    ):
        raise _setting_error(
            "model", recipe.model, "a dict of Transformer arguments"
        )
    try:
        keras.DTypePolicy(recipe.dtype)
    except ValueError:
        raise _setting_error(
            "dtype",
            recipe.dtype,
            "a dtype policy such as 'float32' or 'mixed_bfloat16'",
        ) from None
    _check_schedule_and_validation(recipe)


def _check_schedule_and_validation(recipe):
    """The settings that depend on others: the peak rate, the fine-tuning
    flag and what early stopping watches."""
    peak = recipe.peak_learning_rate
    if peak is not None and (not _is_number(peak) or peak <= 0):
        raise _setting_error(
            "peak_learning_rate", peak, "None or a positive, finite number"
        )
    if peak is not None and recipe.learning_rate_scale != 1:
        raise ValueError(
            f"Recipe settings peak_learning_rate={describe(peak)} and "
            f"learning_rate_scale={describe(recipe.learning_rate_scale)} "
            "both set the peak rate; set learning_rate_scale=1 or "
            "peak_learning_rate=null."
        )
    if not isinstance(recipe.fine_tune, bool):
        raise _setting_error("fine_tune", recipe.fine_tune, "true or false")
    if recipe.early_stopping_patience and not (
        recipe.bleu_subset or recipe.validation_batches
    ):
        raise ValueError(
            "Recipe setting early_stopping_patience="
            f"{describe(recipe.early_stopping_patience)} watches a "
            "validation value, and there is none: set bleu_subset "
            "(val_bleu) or validation_batches (val_loss) above 0, or "
            "early_stopping_patience=0."
        )


RECIPES = {
    # A small model that trains on a CPU in about an hour (the run's
    # measurements and the choices behind these settings: d_ff of
    # 2 x d_model, a short warm-up, the cool-down, the length penalty
    # chosen on the valid split as the paper chose its 0.6 on its
    # development set, are in docs/recipes.md).
    "multi30k_en_de": Recipe(
        name="multi30k_en_de",
        dataset="multi30k",
        train_split="train",
        valid_split="valid",
        test_split="test2016",
        vocabulary_size=8000,
        model={
            "num_encoder_layers": 3,
            "num_decoder_layers": 3,
            "hidden_dim": 256,
            "num_heads": 4,
            "intermediate_dim": 512,
            "dropout": 0.1,
        },
        max_tokens=2048,
        max_length=128,
        warmup_steps=400,
        learning_rate_scale=0.5,
        cooldown_steps=575,
        max_steps=1725,
        steps_per_epoch=345,
        checkpoint_every=115,
        average_last=5,
        length_penalty=1.0,
        bleu_subset=100,
    ),
    # Fine-tuning a trained model (`run_recipe(init=...)`, ``--init``) on
    # Multi30k: the model, its tokenizer and its generation settings are
    # the loaded ones. A trained model needs no long warm-up, and the
    # paper's peak rate (about 1e-3 at d_model 512 and 4,000 warm-up
    # steps) would undo what it learned: a short warm-up to a peak 20
    # times lower, the inverse square root decay and a cool-down, over
    # three epochs at most, stopped after an epoch without a better
    # validation BLEU.
    "multi30k_en_de_finetune": Recipe(
        name="multi30k_en_de_finetune",
        dataset="multi30k",
        train_split="train",
        valid_split="valid",
        test_split="test2016",
        vocabulary_size=8000,  # replaced by the loaded model's
        model={},  # the loaded model's
        max_tokens=2048,
        max_length=128,
        warmup_steps=100,
        peak_learning_rate=5e-5,
        cooldown_steps=345,
        max_steps=1035,
        steps_per_epoch=345,
        checkpoint_every=115,
        average_last=3,
        bleu_subset=100,
        early_stopping_patience=1,
        fine_tune=True,
    ),
    # Section 6.1 and Table 3: 100k steps of ~25k source and target tokens
    # on 8 GPUs; the last 5 checkpoints (10-minute intervals) averaged.
    "wmt14_en_de_base": Recipe(
        name="wmt14_en_de_base",
        dataset="wmt14_en_de",
        train_split="train",
        valid_split="newstest2013",
        test_split="newstest2014",
        vocabulary_size=37000,
        model=get_config("base"),
        max_tokens=25000,
        max_steps=100_000,
        steps_per_epoch=1000,
        checkpoint_every=1000,
        average_last=5,
    ),
    # "big": 300k steps, dropout 0.3, the last 20 checkpoints averaged.
    "wmt14_en_de_big": Recipe(
        name="wmt14_en_de_big",
        dataset="wmt14_en_de",
        train_split="train",
        valid_split="newstest2013",
        test_split="newstest2014",
        vocabulary_size=37000,
        model=get_config("big"),
        max_tokens=25000,
        max_steps=300_000,
        steps_per_epoch=1000,
        checkpoint_every=1000,
        average_last=20,
    ),
}


def get_recipe(name, **overrides):
    if name not in RECIPES:
        raise ValueError(
            f"Unknown recipe {name!r}. Choose one of {sorted(RECIPES)}."
        )
    return RECIPES[name].replace(**overrides)


@dataclasses.dataclass
class RunSummary:
    """What a finished `run_recipe` reports.

    ``monitor`` is the validation value that picks the best epoch
    (``val_bleu``, else ``val_loss``; None without validation),
    ``best_epoch`` that epoch (from 0, the ``epoch`` column of
    ``logs/training.csv``) and ``best_value`` its value; its weights are
    ``checkpoints/best.weights.h5``. ``stopped_early``: early stopping
    ended the run. ``init``: the model the run started from, or None.
    """

    recipe: str
    output: str
    steps: int
    train_minutes: float
    parameters: int
    bleu: float | None
    bleu_signature: str | None
    stopped_by_time_limit: bool
    init: str | None = None
    monitor: str | None = None
    best_epoch: int | None = None
    best_value: float | None = None
    stopped_early: bool = False

    def __str__(self):
        bleu = (
            "not evaluated"
            if self.bleu is None
            else f"{self.bleu:.2f} ({self.bleu_signature})"
        )
        stopped = ""
        if self.stopped_by_time_limit:
            stopped = " (stopped by the time limit)"
        elif self.stopped_early:
            stopped = f" (stopped early: {self.monitor} stopped improving)"
        lines = [f"recipe:      {self.recipe}"]
        if self.init is not None:
            lines.append(f"started from {self.init}")
        lines += [
            f"steps:       {self.steps}{stopped}",
            f"train time:  {self.train_minutes:.1f} min",
            f"parameters:  {self.parameters:,}",
        ]
        if self.best_epoch is not None:
            lines.append(
                f"best epoch:  {self.best_epoch + 1} ({self.monitor} "
                f"{self.best_value:.4g}, checkpoints/{BEST_WEIGHTS})"
            )
        return "\n".join(
            lines
            + [
                f"test BLEU:   {bleu}",
                f"translator:  {self.output} (model, tokenizer, "
                "generation settings)",
            ]
        )


# `Transformer` arguments that come from other recipe settings.
_FROM_RECIPE = ("vocabulary_size", "max_sequence_length", "dtype")
# Model arguments that fine-tuning may change: the dropout rates (section
# 5.4), which shape no weight.
_RETRAINABLE = ("dropout", "attention_dropout", "activation_dropout")


def _model_arguments():
    """The `Transformer` arguments that a recipe's ``model`` holds."""
    known = set(inspect.signature(Transformer.__init__).parameters)
    return known - set(_FROM_RECIPE) - {"self", "kwargs"}


def _check_model_arguments(recipe):
    """Fails before any work on a ``model`` key that `Transformer` does
    not take (it would otherwise fail after the tokenizer is trained)."""
    known = _model_arguments()
    unknown = sorted(set(recipe.model) - known)
    if unknown:
        raise ValueError(
            f"Unknown model arguments {unknown} in recipe "
            f"{recipe.name!r}; the Transformer takes {sorted(known)} "
            f"({', '.join(sorted(_FROM_RECIPE))} come from the recipe's "
            "other settings)."
        )


def run_recipe(
    name,
    data_dir=None,
    output=None,
    max_minutes=None,
    max_steps=None,
    seed=0,
    evaluate=True,
    test_limit=None,
    verbose="auto",
    distribute=None,
    model_parallel=None,
    overwrite=False,
    callbacks=(),
    init=None,
    **overrides,
):
    """Trains a recipe end to end and saves a complete translator.

    Everything the run needs (settings, data files, the output directory)
    is checked before any work, and nothing is written to ``output``
    until the tokenizer, the training batches and the model are ready:
    a run that fails to start leaves ``output`` as it found it.

    Started again with the same ``output``, it resumes from the last
    saved epoch (see `fit_resumable`) when the directory holds a run of
    the same recipe, training settings, data, seed and ``init`` (recorded
    in its ``run.json``); any other existing directory is refused, naming
    the settings that differ, unless ``overwrite=True``.

    After each epoch the run computes the loss and metrics of
    ``validation_batches`` validation batches (``val_loss``, ...) and
    the BLEU of ``bleu_subset`` validation sentences (``val_bleu``),
    keeps the weights of the best epoch (by ``val_bleu``, else
    ``val_loss``) in ``checkpoints/best.weights.h5`` and, with an
    ``early_stopping_patience``, stops when that value has not improved
    for so many epochs.

    Args:
        name: a recipe name (`RECIPES`).
        data_dir: a local directory with the corpus files; None downloads.
        output: the run directory; the translator is saved there
            (`Translator.save`'s files) next to ``run.json``,
            ``checkpoints/``, ``state/``, ``logs/`` and ``results.json``.
        max_minutes: stop training after this much wall-clock time.
        max_steps: override the recipe's number of steps. When it is
            below the recipe's warm-up plus cool-down, both are scaled
            to it (`fit_schedule`), so that a short run still rises to
            its peak rate and cools down: 20 steps of ``multi30k_en_de``
            warm up for 8 and cool down over the last 12.
        seed: seed of initialization, dropout and data order.
        evaluate: translate the test set and report BLEU (the test split
            must then be there before training starts).
        test_limit: evaluate on the first this many test sentences only.
        verbose: Keras verbosity of `fit`.
        distribute: None (one device), ``"data"`` or ``"model"``: train on
            every device the backend sees through its own engine
            (`keras_transformer.distribute`), with the same global batch
            and step counts. Processes other than the first write their
            files to ``output/worker-N``.
        model_parallel: devices on the model axis (``"model"``, JAX).
        overwrite: replace what ``output`` holds, a run (of any settings)
            or a saved translator; the old files are removed only when
            the new run starts writing. A directory holding other files
            is never replaced.
        callbacks: more Keras callbacks for `fit`, after the recipe's.
        init: start from a trained model instead of a new one: a
            directory or Hub repository that `Translator.from_pretrained`
            loads (``"hf://owner/name"``; a Marian/OPUS-MT checkpoint is
            converted). Its weights, tokenizer and generation settings
            are kept; the recipe's model settings, ``vocabulary_size``
            and longest ``max_length`` become the loaded model's, and
            overrides that contradict them are refused (the dropout
            rates may change). ``multi30k_en_de_finetune`` is the
            fine-tuning schedule.
        **overrides: other `Recipe` settings.

    Returns:
        A `RunSummary`.

    Raises:
        RunInterrupted: training was interrupted (Ctrl-C); its message
            says from which epoch the same call resumes.
    """
    from keras_transformer.training.callbacks import TimeLimit

    if max_steps is not None:
        overrides["max_steps"] = max_steps
    if test_limit is not None and (
        not _is_integer(test_limit) or test_limit < 1
    ):
        raise ValueError(
            f"test_limit={describe(test_limit)} must be None (the whole "
            "test set) or a positive integer."
        )
    time_limit = TimeLimit(max_minutes)
    run = _start_run(
        name,
        data_dir,
        output,
        seed,
        overwrite,
        (distribute, model_parallel),
        overrides,
        init=init,
    )
    splits = _read_splits(run, evaluate)
    keras.utils.set_random_seed(seed)
    model = _compiled_model(run)
    tokenizer, dataset, trained = _training_data(run, splits.train, seed)
    validation = _validation_data(run, tokenizer, splits.valid_files)
    # Everything is ready: only now is the output directory written.
    run.directory.start()
    if trained:
        run.directory.save_whole("tokenizer", tokenizer.save)
    recipe_callbacks, best = _callbacks(run, tokenizer, splits, time_limit)
    start = time.monotonic()
    _fit(
        run,
        model,
        (dataset, validation),
        [*recipe_callbacks, *callbacks],
        verbose,
        best,
    )
    train_minutes = (time.monotonic() - start) / 60.0
    return _finish(
        run,
        model,
        tokenizer,
        train_minutes=train_minutes,
        stopped_by_time_limit=time_limit.stopped,
        test_pairs=splits.test[:test_limit] if evaluate else None,
        best=best,
        # The test set's progress bar where fit shows bars (not with 0,
        # nor with 2, one plain line per epoch for a redirected log).
        progress=verbose not in (0, 2),
    )


@dataclasses.dataclass(frozen=True)
class _Init:
    """The trained model a run starts from (``init``)."""

    source: str  # an absolute directory, or "hf://owner/name[@revision]"
    translator: object  # the loaded `Translator`


@dataclasses.dataclass(frozen=True)
class _Run:
    """Where a `run_recipe` run reads and writes, on what devices, and
    from what model."""

    recipe: Recipe
    data_dir: str | None
    directory: object  # a checked `RunDirectory`
    engine: object | None  # a `keras_transformer.distribute` engine
    init: _Init | None
    generation: dict  # `Translator` settings of the saved translator

    @property
    def output(self):  # this process's run directory
        return self.directory.path

    @property
    def checkpoints(self):
        return os.path.join(self.output, "checkpoints")

    @property
    def state(self):
        return os.path.join(self.output, "state")

    @property
    def resume_state(self):
        """The training state a rerun restores: the first process's, in
        every process of a distributed run (the others write theirs in
        OUTPUT/worker-N too), so that all of them resume from one epoch."""
        if self.engine is None or self.engine.is_chief:
            return self.state
        return os.path.join(os.path.dirname(self.output), "state")


def _start_run(
    name, data_dir, output, seed, overwrite, devices, overrides, init=None
):
    """The recipe with its overrides, the loaded ``init`` model's shape
    and its schedule fitted to its steps, the distribution engine and
    the output directory, all checked before any work."""
    recipe = get_recipe(name, **overrides)
    _check_model_arguments(recipe)
    if not _is_integer(seed):
        raise ValueError(f"seed={describe(seed)} must be an integer.")
    if not isinstance(overwrite, bool):
        raise ValueError(
            f"overwrite={describe(overwrite)} must be True or False."
        )
    if recipe.fine_tune and init is None:
        raise ValueError(
            f"Recipe {recipe.name!r} fine-tunes a trained model: pass "
            "init= (--init) a translator directory, a Marian checkpoint "
            "or 'hf://owner/name'; or train from scratch with a recipe "
            "that does not fine-tune."
        )
    loaded = None
    if init is not None:
        loaded = _load_init(init)
        recipe = _recipe_of_init(loaded, recipe, overrides)
    warmup, cooldown = fit_schedule(
        recipe.warmup_steps, recipe.cooldown_steps, recipe.max_steps
    )
    recipe = dataclasses.replace(
        recipe, warmup_steps=warmup, cooldown_steps=cooldown
    )
    output = output or os.path.join("runs", recipe.name)
    engine = _engine(recipe, *devices)
    if engine is not None and not engine.is_chief:
        output = os.path.join(output, f"worker-{engine.process_index}")
    fingerprint = run_fingerprint(recipe, data_dir, seed)
    if loaded is not None:
        fingerprint["init"] = loaded.source
    directory = check_output(output, fingerprint, overwrite, _DEFAULTS)
    generation = _generation_settings(recipe, loaded, overrides)
    return _Run(recipe, data_dir, directory, engine, loaded, generation)


def _load_init(init):
    """The `Translator` of ``init``, loaded (and, from the Hub,
    downloaded) once the recipe's settings are checked."""
    from keras_transformer.generation import Translator

    what = (
        "a translator directory (Translator.save), a Marian checkpoint "
        "directory or 'hf://owner/name'"
    )
    if not isinstance(init, (str, os.PathLike)) or not os.fspath(init):
        raise ValueError(f"init={describe(init)} must be {what}.")
    init = os.fspath(init)
    hub = init.startswith("hf://")
    if not hub and not os.path.isdir(init):
        raise FileNotFoundError(
            f"init={init!r} is not a directory; pass {what}."
        )
    translator = Translator.from_pretrained(init)
    mode = translator.quantization_mode
    if mode is not None:
        raise ValueError(
            f"init={init!r} holds {mode} weights, which do not train; "
            "start from the float model it was quantized from."
        )
    return _Init(init if hub else os.path.abspath(init), translator)


def _recipe_of_init(init, recipe, overrides):
    """The recipe with the loaded model's arguments, vocabulary size and
    (at most) longest sequence; an override that contradicts them is
    refused in one line."""
    config = init.translator.model.get_config()
    shape = {key: config[key] for key in _model_arguments() if key in config}
    given = dict(overrides.get("model", {}))
    contradictions = [
        (f"model.{key}", value, shape.get(key))
        for key, value in given.items()
        if key not in _RETRAINABLE and value != shape.get(key)
    ]
    size = config["vocabulary_size"]
    if overrides.get("vocabulary_size", size) != size:
        contradictions.append(
            ("vocabulary_size", overrides["vocabulary_size"], size)
        )
    longest = config["max_sequence_length"]
    if overrides.get("max_length", 0) > longest:
        contradictions.append(("max_length", overrides["max_length"], longest))
    if contradictions:
        key, value, loaded = contradictions[0]
        raise ValueError(
            f"Recipe setting {key}={describe(value)} contradicts the model "
            f"of init={init.source!r}, whose value is {describe(loaded)}"
            f"{' at most' if key == 'max_length' else ''}; with init the "
            "model's shape and vocabulary are the loaded model's: drop the "
            "setting (--set), or train from scratch without init."
        )
    retrained = {key: given[key] for key in _RETRAINABLE if key in given}
    return dataclasses.replace(
        recipe,
        model={**shape, **retrained},
        vocabulary_size=size,
        max_length=min(recipe.max_length, longest),
    )


def _generation_settings(recipe, init, overrides):
    """The `Translator` settings of the saved translator: the recipe's
    beam size and length penalty, or the loaded model's generation
    settings with those of them that ``overrides`` sets."""
    chosen = ("beam_size", "length_penalty")
    if init is None:
        return {key: getattr(recipe, key) for key in chosen}
    return {
        "generation_config": init.translator.generation_config,
        **{key: getattr(recipe, key) for key in chosen if key in overrides},
    }


def _engine(recipe, distribute, model_parallel):
    if distribute is None:
        return None
    from keras_transformer.distribute import get_distribution

    return get_distribution(
        distribute,
        model_parallel=model_parallel,
        divides=(
            recipe.model.get("num_heads", 8),
            recipe.model.get("hidden_dim", 512),
            recipe.model.get("intermediate_dim", 2048),
        ),
    )


@dataclasses.dataclass(frozen=True)
class _Splits:
    """The data a run needs, found (and the small splits read) before
    any work."""

    train: tuple  # the training split's (source, target) paths
    valid_files: tuple | None  # the validation split's paths
    valid: list | None  # (source, target) pairs for validation BLEU
    test: list | None  # (source, target) pairs for test BLEU


def _read_splits(run, evaluate):
    """The training files (present and not empty), the validation files
    and pairs when the recipe validates after each epoch, and the test
    pairs when the run is evaluated."""
    recipe = run.recipe
    train = _split_files(run, recipe.train_split, "training", "")
    for path in train:
        if os.path.getsize(path) == 0:
            raise ValueError(
                f"The training file {path!r} is empty; put the "
                f"{recipe.train_split!r} split there, one sentence per "
                "line, aligned with the other language's file."
            )
    valid_files = valid = test = None
    fix = " Or set bleu_subset=0 and validation_batches=0 to skip validation."
    if recipe.validation_batches or recipe.bleu_subset:
        valid_files = _split_files(run, recipe.valid_split, "validation", fix)
    if recipe.bleu_subset:
        valid = _split_pairs(run, recipe.valid_split, "validation", fix)
        valid = valid[: recipe.bleu_subset]
    if evaluate:
        fix = " Or pass evaluate=False (--no-evaluate) to skip the test."
        test = _split_pairs(run, recipe.test_split, "test", fix)
    return _Splits(train, valid_files, valid, test)


def _split_files(run, split, what, fix):
    from keras_transformer import data

    try:
        return data.load_dataset(run.recipe.dataset, split, run.data_dir)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"The {what} split {split!r} is missing: {error}{fix}"
        ) from None


def _split_pairs(run, split, what, fix):
    from keras_transformer import data

    files = _split_files(run, split, what, fix)
    pairs, stats = data.read_parallel_corpus(*files)
    if not pairs:
        raise ValueError(
            f"The {what} split {split!r} ({', '.join(files)}) has no "
            f"sentence pair ({stats.report()}).{fix}"
        )
    return pairs


def _compiled_model(run):
    """The recipe's `Transformer` (or the loaded ``init`` model), compiled
    with the paper's optimizer and schedule (section 5.3) and
    label-smoothed loss (section 5.4). Made before the tokenizer is
    trained, whose size is the recipe's, so that a model argument it
    refuses stops the run before any work."""
    from keras_transformer.training import (
        LabelSmoothedCrossEntropy,
        MaskedAccuracy,
        Perplexity,
        transformer_optimizer,
    )

    recipe, engine = run.recipe, run.engine
    # A loaded tokenizer may pad with another id than ours (a Marian
    # model's is its last).
    pad = (
        {}
        if run.init is None
        else {"pad_id": run.init.translator.tokenizer.pad_id}
    )
    loss = LabelSmoothedCrossEntropy(recipe.label_smoothing, **pad)
    # Weights and the optimizer are made on the engine's devices.
    with engine.scope() if engine else contextlib.nullcontext():
        model = _new_model(run)
        model.compile(
            optimizer=transformer_optimizer(
                model.hidden_dim,
                warmup_steps=recipe.warmup_steps,
                scale=_rate_scale(recipe, model.hidden_dim),
                total_steps=recipe.max_steps,
                cooldown_steps=recipe.cooldown_steps,
                gradient_accumulation_steps=(
                    recipe.gradient_accumulation_steps
                ),
            ),
            loss=engine.wrap_loss(loss) if engine else loss,
            metrics=[MaskedAccuracy(**pad), Perplexity(**pad)],
        )
        if engine is not None:
            # Built in the engine's scope, where a resumed run loads the
            # optimizer's state into it: TensorFlow makes a strategy's
            # variables only there.
            model.optimizer.build(model.trainable_variables)
    if engine is not None:
        engine.prepare(model)
    return model


def _new_model(run):
    """A new `Transformer` of the recipe's settings, or one of the loaded
    ``init`` model's configuration (with the recipe's dtype policy and
    dropout rates) holding its weights."""
    recipe = run.recipe
    try:
        if run.init is None:
            return Transformer(
                vocabulary_size=recipe.vocabulary_size,
                max_sequence_length=recipe.max_length,
                dtype=recipe.dtype,
                **recipe.model,
            )
        loaded = run.init.translator.model
        model = Transformer.from_config(
            {**loaded.get_config(), **recipe.model, "dtype": recipe.dtype}
        )
    except ValueError as error:
        raise ValueError(f"Recipe setting model: {error}") from None
    model.set_weights(loaded.get_weights())
    return model


def _rate_scale(recipe, hidden_dim):
    """The schedule's scale: ``learning_rate_scale``, or the one that
    makes section 5.3's rate at the end of the warm-up,
    ``d_model^-0.5 * warmup_steps^-0.5``, equal ``peak_learning_rate``."""
    if recipe.peak_learning_rate is None:
        return recipe.learning_rate_scale
    return recipe.peak_learning_rate * math.sqrt(
        hidden_dim * recipe.warmup_steps
    )


def _training_data(run, train_files, seed):
    """The tokenizer (the ``init`` model's, the one a resumed run saved,
    or one trained on the training split, not yet saved), the repeated
    training batches, and whether the tokenizer was trained here."""
    from keras_transformer import data

    recipe, engine = run.recipe, run.engine
    tokenizer_dir = os.path.join(run.output, "tokenizer")
    trained = run.init is None and not (
        run.directory.resume and os.path.isdir(tokenizer_dir)
    )
    if run.init is not None:
        tokenizer = run.init.translator.tokenizer
    elif trained:
        tokenizer = data.train_tokenizer(
            list(train_files), vocabulary_size=recipe.vocabulary_size
        )
    else:
        tokenizer = data.load_tokenizer(tokenizer_dir)
    if run.init is None and tokenizer.vocabulary_size != recipe.vocabulary_size:
        raise ValueError(
            f"The tokenizer has {tokenizer.vocabulary_size} ids, the "
            f"recipe's vocabulary_size is {recipe.vocabulary_size}; pass "
            "overwrite=True (--overwrite) to start the run afresh."
        )
    dataset = data.translation_dataset(
        *train_files,
        tokenizer,
        max_tokens=recipe.max_tokens,
        shuffle=True,
        seed=seed,
        deterministic=True,
        max_length=recipe.max_length,
        repeat=True,
        batch_multiple=_batch_multiple(run),
    )
    if engine is not None:
        dataset = engine.shard_dataset(dataset)
    return tokenizer, dataset, trained


def _batch_multiple(run):
    """The recipe's ``batch_multiple`` and a multiple of the replicas."""
    replicas = run.engine.num_replicas if run.engine else 1
    return math.lcm(run.recipe.batch_multiple, replicas)


def _validation_data(run, tokenizer, valid_files):
    """The first ``validation_batches`` batches of the validation split,
    batched as the training split is but in corpus order and not
    repeated: the same batches after every epoch. None when the recipe
    has no ``validation_batches``."""
    from keras_transformer import data

    recipe, engine = run.recipe, run.engine
    if not recipe.validation_batches:
        return None
    dataset = data.translation_dataset(
        *valid_files,
        tokenizer,
        max_tokens=recipe.max_tokens,
        shuffle=False,
        max_length=recipe.max_length,
        batch_multiple=_batch_multiple(run),
    ).take(recipe.validation_batches)
    if engine is not None:
        dataset = engine.fit_input(engine.shard_dataset(dataset))
    return dataset


def _fit(run, model, data, callbacks, verbose, best):
    """`fit_resumable` for the recipe's steps, on the training batches
    and validated on the validation batches (``data``); an interrupt
    (Ctrl-C) becomes a `RunInterrupted` that says where a rerun
    resumes. A run that early stopping ended trains no further."""
    from keras_transformer.training import (
        fit_resumable,
        restore_training_state,
    )
    from keras_transformer.training.checkpoints import saved_epoch

    recipe = run.recipe
    dataset, validation = data
    _check_same_state(run)
    if best is not None and best.exhausted:
        restore_training_state(model, run.resume_state)
        return
    counter = _StepCounter(
        recipe.steps_per_epoch,
        recipe.gradient_accumulation_steps or 1,
        first_epoch=saved_epoch(run.resume_state),
    )
    try:
        fit_resumable(
            model,
            dataset,
            total_steps=recipe.max_steps,
            steps_per_epoch=recipe.steps_per_epoch,
            directory=run.state,
            restore_from=run.resume_state,
            callbacks=[counter, *callbacks],
            fit_input=run.engine.fit_input if run.engine else None,
            verbose=verbose,
            validation_data=validation,
        )
    except KeyboardInterrupt as interrupt:
        raise RunInterrupted(
            run.output,
            step=counter.step,
            resume_epoch=saved_epoch(run.resume_state) + 1,
            epochs=math.ceil(recipe.max_steps / recipe.steps_per_epoch),
        ) from interrupt


class _StepCounter(keras.callbacks.Callback):
    """Counts the optimizer steps that `fit` has finished, without reading
    the model's variables: on JAX an interrupt leaves them without values
    (Keras's trainer holds the state outside them during an epoch)."""

    def __init__(self, steps_per_epoch, batches_per_step, first_epoch):
        super().__init__()
        self.batches_per_epoch = steps_per_epoch * batches_per_step
        self.batches_per_step = batches_per_step
        self.batches = first_epoch * self.batches_per_epoch

    def on_epoch_begin(self, epoch, logs=None):
        self.batches = epoch * self.batches_per_epoch

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    @property
    def step(self):
        return self.batches // self.batches_per_step


def _check_same_state(run):
    """Raises, in every process of a distributed run, a one-line error
    when they do not all find the same saved epoch to resume from."""
    from keras_transformer.training.checkpoints import saved_epoch

    if run.engine is None or run.engine.num_processes == 1:
        return
    epoch = saved_epoch(run.resume_state)
    if not run.engine.all_equal(epoch):
        raise ValueError(
            f"Process {run.engine.process_index} finds the training state "
            f"of epoch {epoch} in {run.resume_state}, and another process "
            "another epoch: the processes of a run resume from the first "
            "process's training state, so put the output directory "
            "(--output) on a file system that every host shares."
        )


def _monitor(recipe):
    """The validation value that picks the best epoch and stops early,
    as ``(log key, "max" or "min")``, or None without validation."""
    if recipe.bleu_subset:
        return "val_bleu", "max"
    if recipe.validation_batches:
        return "val_loss", "min"
    return None


def _callbacks(run, tokenizer, splits, time_limit):
    """The time limit, the checkpoints to average, validation BLEU (when
    the recipe asks for it), the best epoch's weights and early stopping
    (`KeepBest`, returned too) and the logs."""
    from keras_transformer.training import KeepLastCheckpoints
    from keras_transformer.training.callbacks import (
        BleuCallback,
        KeepBest,
        LearningRateLogger,
    )

    recipe, engine = run.recipe, run.engine
    logs = os.path.join(run.output, "logs")
    os.makedirs(logs, exist_ok=True)
    callbacks = [
        time_limit,
        *([engine.stop_together()] if engine else []),
        KeepLastCheckpoints(
            run.checkpoints,
            keep=recipe.average_last,
            save_every=recipe.checkpoint_every,
        ),
    ]
    if splits.valid:
        callbacks.append(
            BleuCallback(
                tokenizer,
                [s for s, _ in splits.valid],
                [t for _, t in splits.valid],
                **{**run.generation, "beam_size": 1},
            )
        )
    best = None
    if _monitor(recipe) is not None:
        key, mode = _monitor(recipe)
        best = KeepBest(
            os.path.join(run.checkpoints, BEST_WEIGHTS),
            key,
            mode,
            patience=recipe.early_stopping_patience,
            history=_logged_values(run, key),
        )
        callbacks.append(best)
    # After the validation callbacks, so that they record val_bleu.
    return callbacks + [
        LearningRateLogger(),
        keras.callbacks.CSVLogger(
            os.path.join(logs, TRAINING_LOG), append=True
        ),
        keras.callbacks.TensorBoard(os.path.join(logs, "tensorboard")),
    ], best


def _logged_values(run, key):
    """``(epoch, value)`` of ``key`` in the training log for the epochs a
    resumed run has already trained (the last row of each: an epoch cut
    short by a time limit is trained, and logged, again)."""
    from keras_transformer.training.checkpoints import saved_epoch

    path = os.path.join(run.output, "logs", TRAINING_LOG)
    done = saved_epoch(run.resume_state)
    if not done or not os.path.isfile(path):
        return []
    values = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            # CSVLogger writes "NA" for a value an epoch did not log.
            with contextlib.suppress(TypeError, ValueError):
                if int(row["epoch"]) < done:
                    values[int(row["epoch"])] = float(row.get(key))
    return sorted(values.items())


def _finish(
    run,
    model,
    tokenizer,
    train_minutes,
    stopped_by_time_limit,
    test_pairs,
    best,
    progress=True,
):
    """Averages the last checkpoints (section 6.1), saves the translator,
    evaluates it on the test pairs (unless None; a progress bar with
    ``progress``) and writes ``results.json``."""
    from keras_transformer.distribute import on_this_process, whole_copy
    from keras_transformer.generation import Translator
    from keras_transformer.training import (
        average_checkpoints,
        list_checkpoints,
    )

    recipe = run.recipe
    steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    local = whole_copy(model)
    to_average = list_checkpoints(run.checkpoints)[-recipe.average_last :]
    bleu = signature = None
    # Weights split over several hosts are averaged, saved and evaluated
    # in a whole copy on this process's device, as the checkpoints hold
    # them whole.
    place = contextlib.nullcontext() if local is model else on_this_process()
    model = local
    with place:
        if len(to_average) > 1:
            average_checkpoints(model, to_average)
        translator = Translator(model, tokenizer, **run.generation)
        translator.save(run.output)
        if test_pairs is not None:
            bleu, signature = _test_bleu(run, translator, test_pairs, progress)
    summary = RunSummary(
        recipe=recipe.name,
        output=run.output,
        steps=steps,
        train_minutes=train_minutes,
        parameters=model.count_params(),
        bleu=bleu,
        bleu_signature=signature,
        stopped_by_time_limit=stopped_by_time_limit,
        init=None if run.init is None else run.init.source,
        **_best_epoch(best),
    )
    write_json(
        os.path.join(run.output, RESULTS_FILE),
        {
            **dataclasses.asdict(summary),
            "recipe_settings": dataclasses.asdict(recipe),
            "averaged_checkpoints": [os.path.basename(p) for p in to_average],
        },
        sort_keys=False,
    )
    return summary


def _best_epoch(best):
    """The `RunSummary` fields of a `KeepBest` (None: no validation)."""
    if best is None or best.best_epoch is None:
        return {}
    return {
        "monitor": best.monitor,
        "best_epoch": best.best_epoch,
        "best_value": best.best,
        "stopped_early": best.stopped_early,
    }


def _test_bleu(run, translator, test_pairs, progress):
    """sacreBLEU of the translator on the test pairs and its signature;
    the translations go to ``test_translations.txt``."""
    from keras_transformer.generation import evaluate_bleu

    result = evaluate_bleu(
        translator,
        [s for s, _ in test_pairs],
        [t for _, t in test_pairs],
        verbose="auto" if progress else False,
    )
    with open(os.path.join(run.output, "test_translations.txt"), "w") as f:
        f.writelines(h + "\n" for h in result.hypotheses)
    return result.score, result.signature
