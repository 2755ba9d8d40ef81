"""The training recipes: the paper's recipe with each dataset's settings,
run end to end (tokenizer, pipeline, `model.fit`, checkpoint averaging,
BLEU on the test set, a saved translator)."""

import contextlib
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
            (0 to skip).
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
    dtype: str = "float32"

    def __post_init__(self):
        _check_recipe(self)

    def replace(self, **overrides):
        return replace_settings(self, overrides, "recipe settings")


# The least value of each integer setting.
_INTEGER_SETTINGS = {
    "vocabulary_size": 8,  # 4 ids are reserved
    "max_tokens": 1,
    "max_length": 2,  # a token and the start or end id
    "warmup_steps": 1,
    "cooldown_steps": 0,
    "max_steps": 1,
    "steps_per_epoch": 1,
    "checkpoint_every": 1,
    "average_last": 1,
    "beam_size": 1,
    "bleu_subset": 0,
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
    """What a finished `run_recipe` reports."""

    recipe: str
    output: str
    steps: int
    train_minutes: float
    parameters: int
    bleu: float | None
    bleu_signature: str | None
    stopped_by_time_limit: bool

    def __str__(self):
        bleu = (
            "not evaluated"
            if self.bleu is None
            else f"{self.bleu:.2f} ({self.bleu_signature})"
        )
        return "\n".join(
            [
                f"recipe:      {self.recipe}",
                f"steps:       {self.steps}"
                + (
                    " (stopped by the time limit)"
                    if self.stopped_by_time_limit
                    else ""
                ),
                f"train time:  {self.train_minutes:.1f} min",
                f"parameters:  {self.parameters:,}",
                f"test BLEU:   {bleu}",
                f"translator:  {self.output} (model, tokenizer/, "
                "generation settings)",
            ]
        )


def _check_model_arguments(recipe):
    """Fails before any work on a ``model`` key that `Transformer` does
    not take (it would otherwise fail after the tokenizer is trained)."""
    from_recipe = {"vocabulary_size", "max_sequence_length", "dtype"}
    known = set(inspect.signature(Transformer.__init__).parameters)
    known -= from_recipe | {"self", "kwargs"}
    unknown = sorted(set(recipe.model) - known)
    if unknown:
        raise ValueError(
            f"Unknown model arguments {unknown} in recipe "
            f"{recipe.name!r}; the Transformer takes {sorted(known)} "
            f"({', '.join(sorted(from_recipe))} come from the recipe's "
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
    **overrides,
):
    """Trains a recipe end to end and saves a complete translator.

    Everything the run needs (settings, data files, the output directory)
    is checked before any work, and nothing is written to ``output``
    until the tokenizer, the training batches and the model are ready:
    a run that fails to start leaves ``output`` as it found it.

    Started again with the same ``output``, it resumes from the last
    saved epoch (see `fit_resumable`) when the directory holds a run of
    the same recipe, training settings, data and seed (recorded in its
    ``run.json``); any other existing directory is refused, naming the
    settings that differ, unless ``overwrite=True``.

    Args:
        name: a recipe name (`RECIPES`).
        data_dir: a local directory with the corpus files; None downloads.
        output: the run directory; the translator is saved there
            (``config.json``, ``model.weights.h5``, ``tokenizer/``,
            ``generation_config.json``) next to ``run.json``,
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
    )
    splits = _read_splits(run, evaluate)
    keras.utils.set_random_seed(seed)
    model = _compiled_model(run)
    tokenizer, dataset, trained = _training_data(run, splits.train, seed)
    # Everything is ready: only now is the output directory written.
    run.directory.start()
    if trained:
        run.directory.save_whole("tokenizer", tokenizer.save)
    callbacks = [
        *_callbacks(run, tokenizer, splits.valid, time_limit),
        *callbacks,
    ]
    start = time.monotonic()
    _fit(run, model, dataset, callbacks, verbose)
    train_minutes = (time.monotonic() - start) / 60.0
    return _finish(
        run,
        model,
        tokenizer,
        train_minutes=train_minutes,
        stopped_by_time_limit=time_limit.stopped,
        test_pairs=splits.test[:test_limit] if evaluate else None,
    )


@dataclasses.dataclass(frozen=True)
class _Run:
    """Where a `run_recipe` run reads and writes, and on what devices."""

    recipe: Recipe
    data_dir: str | None
    directory: object  # a checked `RunDirectory`
    engine: object | None  # a `keras_transformer.distribute` engine

    @property
    def output(self):  # this process's run directory
        return self.directory.path

    @property
    def checkpoints(self):
        return os.path.join(self.output, "checkpoints")

    @property
    def state(self):
        return os.path.join(self.output, "state")


def _start_run(name, data_dir, output, seed, overwrite, devices, overrides):
    """The recipe with its overrides and its schedule fitted to its
    steps, the distribution engine and the output directory, all checked
    before any work."""
    recipe = get_recipe(name, **overrides)
    _check_model_arguments(recipe)
    if not _is_integer(seed):
        raise ValueError(f"seed={describe(seed)} must be an integer.")
    if not isinstance(overwrite, bool):
        raise ValueError(
            f"overwrite={describe(overwrite)} must be True or False."
        )
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
    directory = check_output(
        output, run_fingerprint(recipe, data_dir, seed), overwrite
    )
    return _Run(recipe, data_dir, directory, engine)


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
    valid: list | None  # (source, target) pairs for validation BLEU
    test: list | None  # (source, target) pairs for test BLEU


def _read_splits(run, evaluate):
    """The training files (present and not empty), the validation pairs
    when the recipe translates some after each epoch, and the test pairs
    when the run is evaluated."""
    recipe = run.recipe
    train = _split_files(run, recipe.train_split, "training", "")
    for path in train:
        if os.path.getsize(path) == 0:
            raise ValueError(
                f"The training file {path!r} is empty; put the "
                f"{recipe.train_split!r} split there, one sentence per "
                "line, aligned with the other language's file."
            )
    valid = test = None
    if recipe.bleu_subset:
        fix = " Or set bleu_subset=0 to skip validation BLEU."
        valid = _split_pairs(run, recipe.valid_split, "validation", fix)
        valid = valid[: recipe.bleu_subset]
    if evaluate:
        fix = " Or pass evaluate=False (--no-evaluate) to skip the test."
        test = _split_pairs(run, recipe.test_split, "test", fix)
    return _Splits(train, valid, test)


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
    """The recipe's `Transformer`, compiled with the paper's optimizer and
    schedule (section 5.3) and label-smoothed loss (section 5.4). Made
    before the tokenizer is trained, whose size is the recipe's, so that
    a model argument it refuses stops the run before any work."""
    from keras_transformer.training import (
        LabelSmoothedCrossEntropy,
        MaskedAccuracy,
        Perplexity,
        transformer_optimizer,
    )

    recipe, engine = run.recipe, run.engine
    loss = LabelSmoothedCrossEntropy(recipe.label_smoothing)
    # Weights and the optimizer are made on the engine's devices.
    with engine.scope() if engine else contextlib.nullcontext():
        try:
            model = Transformer(
                vocabulary_size=recipe.vocabulary_size,
                max_sequence_length=recipe.max_length,
                dtype=recipe.dtype,
                **recipe.model,
            )
        except ValueError as error:
            raise ValueError(f"Recipe setting model: {error}") from None
        model.compile(
            optimizer=transformer_optimizer(
                model.hidden_dim,
                warmup_steps=recipe.warmup_steps,
                scale=recipe.learning_rate_scale,
                total_steps=recipe.max_steps,
                cooldown_steps=recipe.cooldown_steps,
                gradient_accumulation_steps=(
                    recipe.gradient_accumulation_steps
                ),
            ),
            loss=engine.wrap_loss(loss) if engine else loss,
            metrics=[MaskedAccuracy(), Perplexity()],
        )
    if engine is not None:
        engine.prepare(model)
    return model


def _training_data(run, train_files, seed):
    """The tokenizer (the one a resumed run saved, or one trained on the
    training split, not yet saved), the repeated training batches, and
    whether the tokenizer was trained here."""
    from keras_transformer import data

    recipe, engine = run.recipe, run.engine
    tokenizer_dir = os.path.join(run.output, "tokenizer")
    trained = not (run.directory.resume and os.path.isdir(tokenizer_dir))
    if trained:
        tokenizer = data.train_tokenizer(
            list(train_files), vocabulary_size=recipe.vocabulary_size
        )
    else:
        tokenizer = data.load_tokenizer(tokenizer_dir)
    if tokenizer.vocabulary_size != recipe.vocabulary_size:
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
        batch_multiple=engine.num_replicas if engine else 1,
    )
    if engine is not None:
        dataset = engine.shard_dataset(dataset)
    return tokenizer, dataset, trained


def _fit(run, model, dataset, callbacks, verbose):
    """`fit_resumable` for the recipe's steps; an interrupt (Ctrl-C)
    becomes a `RunInterrupted` that says where a rerun resumes."""
    from keras_transformer.training import fit_resumable
    from keras_transformer.training.checkpoints import saved_epoch

    recipe = run.recipe
    try:
        fit_resumable(
            model,
            dataset,
            total_steps=recipe.max_steps,
            steps_per_epoch=recipe.steps_per_epoch,
            directory=run.state,
            callbacks=callbacks,
            verbose=verbose,
        )
    except KeyboardInterrupt as interrupt:
        step = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        raise RunInterrupted(
            run.output,
            step=step,
            resume_epoch=saved_epoch(run.state) + 1,
            epochs=math.ceil(recipe.max_steps / recipe.steps_per_epoch),
        ) from interrupt


def _callbacks(run, tokenizer, valid_pairs, time_limit):
    """The time limit, the checkpoints to average, validation BLEU (when
    the recipe asks for it) and the logs."""
    from keras_transformer.training import KeepLastCheckpoints
    from keras_transformer.training.callbacks import (
        BleuCallback,
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
    if valid_pairs:
        callbacks.append(
            BleuCallback(
                tokenizer,
                [s for s, _ in valid_pairs],
                [t for _, t in valid_pairs],
                best_path=os.path.join(run.output, "best.weights.h5"),
                beam_size=1,
            )
        )
    # After the BLEU callback, so that they record val_bleu.
    return callbacks + [
        LearningRateLogger(),
        keras.callbacks.CSVLogger(
            os.path.join(logs, "training.csv"), append=True
        ),
        keras.callbacks.TensorBoard(os.path.join(logs, "tensorboard")),
    ]


def _finish(
    run,
    model,
    tokenizer,
    train_minutes,
    stopped_by_time_limit,
    test_pairs,
):
    """Averages the last checkpoints (section 6.1), saves the translator,
    evaluates it on the test pairs (unless None) and writes
    ``results.json``."""
    from keras_transformer.generation import Translator
    from keras_transformer.training import (
        average_checkpoints,
        list_checkpoints,
    )

    recipe = run.recipe
    steps = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    to_average = list_checkpoints(run.checkpoints)[-recipe.average_last :]
    if len(to_average) > 1:
        average_checkpoints(model, to_average)
    translator = Translator(
        model,
        tokenizer,
        beam_size=recipe.beam_size,
        length_penalty=recipe.length_penalty,
    )
    translator.save(run.output)
    bleu = signature = None
    if test_pairs is not None:
        bleu, signature = _test_bleu(run, translator, test_pairs)
    summary = RunSummary(
        recipe=recipe.name,
        output=run.output,
        steps=steps,
        train_minutes=train_minutes,
        parameters=model.count_params(),
        bleu=bleu,
        bleu_signature=signature,
        stopped_by_time_limit=stopped_by_time_limit,
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


def _test_bleu(run, translator, test_pairs):
    """sacreBLEU of the translator on the test pairs and its signature;
    the translations go to ``test_translations.txt``."""
    from keras_transformer.generation import evaluate_bleu

    result = evaluate_bleu(
        translator,
        [s for s, _ in test_pairs],
        [t for _, t in test_pairs],
    )
    with open(os.path.join(run.output, "test_translations.txt"), "w") as f:
        f.writelines(h + "\n" for h in result.hypotheses)
    return result.score, result.signature
