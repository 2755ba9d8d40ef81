"""The output directory of `run_recipe`: checked before any work, never
clobbered, and written only once the run has everything it needs, so
that a run that fails to start leaves it as it found it."""

import dataclasses
import json
import os
import re
import shutil
import tempfile

from keras_transformer.io_utils import read_json, write_json

RUN_FILE = "run.json"
RUN_FORMAT_VERSION = 1
# Settings that change what a run reports, not what it trains: a run
# resumes with other values of them.
EVALUATION_SETTINGS = (
    "beam_size",
    "length_penalty",
    "bleu_subset",
    "validation_batches",
)
# What a run or a saved translator of this package holds: the only names
# that ``overwrite=True`` removes.
RUN_ENTRIES = frozenset(
    {
        RUN_FILE,
        "config.json",
        "generation_config.json",
        "model.weights.h5",
        "model.safetensors",
        "tokenizer",
        # KerasHub's preset layout, which a saved translator follows.
        "metadata.json",
        "task.json",
        "preprocessor.json",
        "tokenizer.json",
        "assets",
        "checkpoints",
        "state",
        "logs",
        "results.json",
        "best.weights.h5",
        "test_translations.txt",
        "manifest.json",
        "README.md",
        ".gitattributes",
    }
)
# Names that only this package's runs and translators hold: a directory
# of the other names alone (a README.md, logs/) is not taken for one.
_CORE_ENTRIES = frozenset(
    {RUN_FILE, "config.json", "model.weights.h5", "tokenizer", "state"}
)
# Files being written (`write_json`'s ``.partial``, ours) and the
# directories of the other processes of a distributed run.
TEMPORARY_PREFIX = ".partial-"
_WORKER = re.compile(r"worker-\d+")


def _is_temporary(name):
    return name.startswith(TEMPORARY_PREFIX) or (
        name.endswith(".partial") and name[: -len(".partial")] in RUN_ENTRIES
    )


def _is_run_entry(name):
    return (
        name in RUN_ENTRIES
        or _is_temporary(name)
        or _WORKER.fullmatch(name) is not None
    )


class RunInterrupted(KeyboardInterrupt):
    """Training was interrupted (Ctrl-C); ``str(error)`` says in one line
    from which epoch the same command resumes.

    Attributes:
        output: the run directory.
        step: the optimizer step reached.
        resume_epoch: the epoch (counted from 1) a rerun starts with.
        epochs: the run's number of epochs.
    """

    def __init__(self, output, step, resume_epoch, epochs):
        self.output = output
        self.step = step
        self.resume_epoch = resume_epoch
        self.epochs = epochs
        if resume_epoch > 1:
            saved = f"the training state of epoch {resume_epoch - 1} is saved"
        else:
            saved = "no epoch had finished"
        super().__init__(
            f"Training interrupted at step {step} ({saved} in {output}); "
            "run the same command again to resume from epoch "
            f"{resume_epoch} of {epochs}."
        )


def run_fingerprint(recipe, data_dir, seed):
    """What a run directory must have been started with to be resumed:
    the recipe's name and training settings, the data and the seed, as
    JSON values."""
    settings = {
        key: value
        for key, value in dataclasses.asdict(recipe).items()
        if key not in EVALUATION_SETTINGS and key != "name"
    }
    fingerprint = {
        "format_version": RUN_FORMAT_VERSION,
        "recipe": recipe.name,
        "settings": settings,
        "data_dir": (
            None if data_dir is None else os.path.abspath(os.fspath(data_dir))
        ),
        "seed": seed,
    }
    return json.loads(json.dumps(fingerprint))


@dataclasses.dataclass(frozen=True)
class RunDirectory:
    """A checked output directory.

    Attributes:
        path: the directory.
        fingerprint: `run_fingerprint` of the run about to start.
        resume: it holds a run with this fingerprint, which goes on.
        replace: the entries of an old run that `start` removes first
            (``overwrite=True``).
    """

    path: str
    fingerprint: dict
    resume: bool
    replace: tuple = ()

    def start(self):
        """Called when the run has everything it needs: removes the old
        run being overwritten and records the fingerprint."""
        for name in self.replace:
            entry = os.path.join(self.path, name)
            if os.path.isdir(entry) and not os.path.islink(entry):
                shutil.rmtree(entry)
            else:
                os.remove(entry)
        os.makedirs(self.path, exist_ok=True)
        write_json(os.path.join(self.path, RUN_FILE), self.fingerprint)

    def save_whole(self, name, save):
        """``save(path)`` writes a file or directory under a temporary
        name, which then becomes ``name``: a failure half-way leaves no
        ``name`` that a rerun would take for complete."""
        temporary = os.path.join(self.path, TEMPORARY_PREFIX + name)
        if os.path.isdir(temporary):
            shutil.rmtree(temporary)
        save(temporary)
        os.replace(temporary, os.path.join(self.path, name))


def check_output(path, fingerprint, overwrite=False, defaults=None):
    """Checks, before any work, that ``path`` can take the run described
    by ``fingerprint``: a new or empty directory, a run with the same
    fingerprint (resumed), or with ``overwrite=True`` a run or translator
    directory of this package (replaced). Returns a `RunDirectory`.

    ``defaults`` maps settings to their default values: a run recorded
    before a setting existed resumes when the setting has its default.

    Raises:
        FileExistsError: ``path`` or a parent of it is a file.
        ValueError: ``path`` holds another run, a translator or other
            files, or cannot be written.
    """
    path = os.path.abspath(os.fspath(path))
    _check_writable(path)
    entries = sorted(os.listdir(path)) if os.path.isdir(path) else []
    others = [name for name in entries if not _is_run_entry(name)]
    if not _CORE_ENTRIES & set(entries):
        others = [
            name
            for name in entries
            if not (_is_temporary(name) or _WORKER.fullmatch(name))
        ]
    if others:
        raise ValueError(
            f"output={path!r} holds files that are not a keras_transformer "
            f"run ({_names(others)}); pass another output (--output): "
            "overwrite=True (--overwrite) only replaces a run or a saved "
            "translator."
        )
    # The other processes of a distributed run write their own
    # directories inside this one; what a killed write left behind is
    # replaced by the next.
    removable = [name for name in entries if not _WORKER.fullmatch(name)]
    significant = [name for name in removable if not _is_temporary(name)]
    if not significant:
        return RunDirectory(path, fingerprint, False, tuple(removable))
    run_file = os.path.join(path, RUN_FILE)
    old = read_json(run_file) if os.path.isfile(run_file) else None
    if overwrite:
        return RunDirectory(path, fingerprint, False, tuple(removable))
    if old is None:
        raise ValueError(
            f"output={path!r} holds a saved translator or a run without "
            f"recorded settings ({_names(significant)}); pass overwrite=True "
            "(--overwrite) to replace it, or another output (--output)."
        )
    differences = _differences(old, fingerprint, defaults or {})
    if differences:
        raise ValueError(
            f"output={path!r} holds a run with other settings "
            f"({'; '.join(differences)}); pass overwrite=True "
            "(--overwrite) to replace it, or another output (--output), "
            "or the run's settings to resume it."
        )
    return RunDirectory(path, fingerprint, resume=True)


def _names(entries, limit=5):
    shown = [
        name + "/" if name in ("tokenizer", "checkpoints", "state") else name
        for name in entries[:limit]
    ]
    more = len(entries) - limit
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _flatten(values, prefix=""):
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _differences(old, new, defaults):
    """``"vocabulary_size is 600 in the run, 700 now"`` for each setting
    that differs (a model argument as ``model.hidden_dim``); a setting
    that the old run did not record had its value in ``defaults``."""
    old, new = _flatten(old), _flatten(new)
    for key, value in defaults.items():
        if f"settings.{key}" in new:
            old.setdefault(f"settings.{key}", value)
    differences = []
    for key in sorted(set(old) | set(new)):
        if old.get(key, "<unset>") == new.get(key, "<unset>"):
            continue
        name = key.removeprefix("settings.")
        there = json.dumps(old[key]) if key in old else "unset"
        here = json.dumps(new[key]) if key in new else "unset"
        differences.append(f"{name} is {there} in the run, {here} now")
    return differences


def _check_writable(path):
    """Raises a one-line error when the directory ``path`` (an absolute
    path) cannot be created or written."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(
            f"output={path!r} is a file; pass a directory (--output): a "
            "new one, or a run to resume."
        )
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise FileExistsError(
            f"output={path!r} cannot be created: {existing!r} is a file. "
            "Pass a directory path (--output) whose parents are "
            "directories."
        )
    try:
        descriptor, probe = tempfile.mkstemp(
            dir=existing, prefix=TEMPORARY_PREFIX
        )
    except OSError as error:
        raise ValueError(
            f"output={path!r} cannot be written ({error.strerror} in "
            f"{existing!r}); pass a directory you can write to (--output)."
        ) from None
    os.close(descriptor)
    os.remove(probe)


__all__ = [
    "RunDirectory",
    "RunInterrupted",
    "check_output",
    "run_fingerprint",
]
