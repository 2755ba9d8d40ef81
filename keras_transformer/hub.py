"""Sharing translators on the Hugging Face Hub.

`push_to_hub` uploads a `Translator` in one commit: the files of
`Translator.save` (a KerasHub preset: ``config.json``,
``model.weights.h5``, ``task.json``, ``metadata.json`` and the
tokenizer's files), a ``model.safetensors`` copy of the weights
by path (an int8 translator's as int8 kernels and their scales),
the training record (``results.json``, when there is one), a
``manifest.json`` of sha256 checksums and a ``README.md`` model card.

`resolve_directory` turns ``"hf://owner/name"`` (optionally
``"hf://owner/name@revision"``) into a verified local snapshot in the
Hugging Face cache: every file the manifest lists must be there with its
sha256, or loading stops with an error naming the file. Nothing is
executed or unpickled: configurations are JSON, weights HDF5 read by
Keras, the tokenizer a SentencePiece model.

Example:
>>> translator.push_to_hub("me/multi30k-en-de", results="runs/multi30k")
'5c0b...'
>>> kt.Translator.from_pretrained("hf://me/multi30k-en-de@v1.0")
"""

import dataclasses
import hashlib
import importlib.resources
import os
import pathlib
import tempfile

from keras_transformer.io_utils import read_json, write_json
from keras_transformer.version import __version__

HF_PREFIX = "hf://"
MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
SAFETENSORS_FILE = "model.safetensors"
RESULTS_FILE = "results.json"
CARD_FILE = "README.md"
# Publishing settings of the checkpoints the recipes produce, one JSON
# file per recipe: package data, so that an installed wheel has them too.
SETTINGS_DIR = importlib.resources.files("keras_transformer") / "hub_settings"
# Files the loader never reads: the card may be edited on the Hub.
_NOT_IN_MANIFEST = (CARD_FILE, MANIFEST_FILE, ".gitattributes")


class ChecksumError(ValueError):
    """A file does not match the sha256 its manifest records."""


class ManifestPathError(ValueError):
    """A manifest entry that would read a file outside its directory."""


# --- references


def is_hub_reference(reference):
    return isinstance(reference, str) and reference.startswith(HF_PREFIX)


def parse_reference(reference, revision=None):
    """``"hf://owner/name@rev"`` -> ``("owner/name", "rev")``; the
    revision is ``revision`` (or ``"main"``) when the reference has none."""
    body = reference[len(HF_PREFIX) :]
    repo_id, at, pinned = body.partition("@")
    if at and not pinned:
        raise ValueError(
            f"{reference!r} ends with '@' but names no revision; write "
            f"hf://{repo_id}@BRANCH_TAG_OR_COMMIT or leave out the '@'."
        )
    if at and revision is not None and revision != pinned:
        raise ValueError(
            f"{reference!r} pins revision {pinned!r} but revision="
            f"{revision!r} was passed too; give one of them."
        )
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(
            f"{reference!r} is not a Hub reference; expected "
            "hf://OWNER/NAME or hf://OWNER/NAME@REVISION."
        )
    return repo_id, pinned or revision or "main"


# --- manifest


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory):
    """Relative POSIX paths of the files under ``directory``, sorted."""
    root = pathlib.Path(directory)
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and not p.relative_to(root).parts[0].startswith(".")
    )


def write_manifest(directory):
    """Writes ``manifest.json``: the sha256 and size of every file in
    ``directory`` but the card (and the manifest itself)."""
    files = {}
    for name in _files(directory):
        if name in _NOT_IN_MANIFEST:
            continue
        path = os.path.join(directory, name)
        files[name] = {"sha256": _sha256(path), "size": os.path.getsize(path)}
    manifest = {
        "format_version": MANIFEST_VERSION,
        "algorithm": "sha256",
        "keras_transformer_version": __version__,
        "files": files,
    }
    write_json(os.path.join(directory, MANIFEST_FILE), manifest)
    return manifest


def verify_directory(directory, fix=None, root=None):
    """Checks every file ``manifest.json`` lists against its sha256.

    Every entry is checked to name a file inside the directory before any
    file is read: a manifest is data from the Hub, and an entry such as
    ``../../.ssh/id_rsa`` must not make the loader read (and print the
    hash of) a file elsewhere.

    Args:
        directory: a translator directory with a ``manifest.json``.
        fix: what the error messages suggest to repair a bad file.
        root: the directory the files may resolve into through symbolic
            links (default: ``directory``). A Hugging Face cache snapshot
            links its files to the repository's ``blobs/``, so for one
            this is the repository's cache folder.

    Returns:
        The manifest (a dict).

    Raises:
        ManifestPathError: an entry is absolute, contains ``..`` or
            resolves outside ``root`` (nothing has been read then).
        ChecksumError: a file's size or sha256 differs from the record.
        FileNotFoundError: a listed file is missing.
        ValueError: the manifest has an unknown format version.
    """
    directory = os.fspath(directory)
    fix = fix or "Save or download the translator again."
    manifest = read_json(os.path.join(directory, MANIFEST_FILE))
    version = manifest.get("format_version")
    if version != MANIFEST_VERSION or manifest.get("algorithm") != "sha256":
        raise ValueError(
            f"{MANIFEST_FILE} in {directory!r} has format_version="
            f"{version!r} (algorithm {manifest.get('algorithm')!r}); this "
            f"keras-transformer ({__version__}) reads format_version="
            f"{MANIFEST_VERSION} with sha256. Upgrade keras-transformer, "
            "or pull a revision pushed by this version."
        )
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ValueError(
            f"{MANIFEST_FILE} in {directory!r} has no 'files' mapping of "
            f"paths to checksums. {fix}"
        )
    root = os.path.realpath(directory if root is None else root)
    for name in sorted(files, key=str):
        problem = _entry_problem(directory, name, root)
        if problem:
            raise ManifestPathError(
                f"{MANIFEST_FILE} in {directory!r} lists {name!r}, "
                f"{problem}; refusing to read any file. {fix}"
            )
    for name, record in sorted(files.items()):
        _verify_file(directory, name, record, fix)
    return manifest


def _entry_problem(directory, name, root):
    """Why the manifest entry ``name`` may not be read, or None: it must
    be a relative POSIX path without ``..`` that stays inside ``root``
    once symbolic links are resolved."""
    if not isinstance(name, str) or not name:
        return "which is not a relative file path"
    # Both separators: a backslash separates on Windows.
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or pathlib.PureWindowsPath(name).drive:
        return "an absolute path"
    if ".." in parts:
        return "a path that leaves the directory through '..'"
    resolved = os.path.realpath(_entry_path(directory, name))
    if os.path.commonpath([root, resolved]) != root:
        return "a symbolic link that resolves outside the directory"
    return None


def _entry_path(directory, name):
    return os.path.join(directory, *name.split("/"))


def _verify_file(directory, name, record, fix):
    """Raises unless the file ``name`` has the size and sha256 of
    ``record``."""
    path = _entry_path(directory, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{name} is listed in {MANIFEST_FILE} but missing from "
            f"{directory!r}. {fix}"
        )
    size = os.path.getsize(path)
    actual = _sha256(path)
    record = record if isinstance(record, dict) else {}
    expected = (record.get("size"), record.get("sha256"))
    if (size, actual) != expected:
        raise ChecksumError(
            f"{name} in {directory!r} is corrupt or was altered: its "
            f"sha256 is {actual} ({size} bytes), the manifest records "
            f"{expected[1]} ({expected[0]} bytes). Refusing to load it. "
            f"{fix}"
        )


# --- downloading


def resolve_directory(
    reference, revision=None, token=None, local_files_only=False
):
    """A local, verified directory for a translator reference.

    ``"hf://owner/name[@revision]"`` is downloaded into (or found in) the
    Hugging Face cache; a local directory is returned as is. Either way,
    a ``manifest.json`` in it is verified (`verify_directory`).

    Args:
        reference: ``"hf://owner/name"``, ``"hf://owner/name@revision"``
            or a local directory.
        revision: a branch, tag or commit id (Hub references only).
        token: a Hub token, for private repositories.
        local_files_only: use the cache only, never the network (as does
            ``HF_HUB_OFFLINE=1``).
    """
    if not is_hub_reference(reference):
        if revision is not None:
            raise ValueError(
                f"revision={revision!r} applies to Hub references "
                f"(hf://OWNER/NAME), not to the local path {reference!r}."
            )
        directory = os.fspath(reference)
        if os.path.isfile(os.path.join(directory, MANIFEST_FILE)):
            verify_directory(
                directory,
                fix="Download it again; or, if the files were changed on "
                "purpose (e.g. Translator.save into this folder), record "
                "them with keras_transformer.hub.write_manifest(directory).",
            )
        return directory
    repo_id, revision = parse_reference(reference, revision)
    directory = download(repo_id, revision, token, local_files_only)
    repo_cache = pathlib.Path(directory).parents[1]
    fix = (
        f"Delete the cached copy ({repo_cache}) and load it again to "
        "download it afresh; if the error persists, the file on the Hub "
        f"does not match its manifest: push {repo_id} again."
    )
    if os.path.isfile(os.path.join(directory, MANIFEST_FILE)):
        # The snapshot's files link into the repository's blobs/.
        verify_directory(directory, fix=fix, root=repo_cache)
    elif _is_translator(directory):
        raise ValueError(
            f"hf://{repo_id}@{revision} holds a keras-transformer "
            f"translator without {MANIFEST_FILE}, so its files cannot be "
            "verified. Push it again with Translator.push_to_hub."
        )
    return directory


# Weights for other frameworks that Hub repositories (OPUS-MT's among
# them) often hold next to the PyTorch ones: about a gigabyte per model
# that no loader here reads.
FOREIGN_WEIGHTS = (
    "tf_model.h5",
    "flax_model.msgpack",
    "rust_model.ot",
    "*.onnx",
    "onnx/*",
)


def download(repo_id, revision="main", token=None, local_files_only=False):
    """`huggingface_hub.snapshot_download` with clear errors; returns the
    snapshot directory in the Hugging Face cache. Other frameworks'
    weights (`FOREIGN_WEIGHTS`) are not downloaded."""
    import huggingface_hub
    from huggingface_hub import constants, errors

    where = f"hf://{repo_id}@{revision}"
    try:
        return huggingface_hub.snapshot_download(
            repo_id,
            revision=revision,
            token=token,
            local_files_only=local_files_only,
            ignore_patterns=list(FOREIGN_WEIGHTS),
            library_name="keras-transformer",
            library_version=__version__,
        )
    except errors.RevisionNotFoundError as error:
        raise FileNotFoundError(
            f"{repo_id} has no revision {revision!r} (a branch, tag or "
            f"commit id). List them with HfApi().list_repo_refs"
            f"({repo_id!r})."
        ) from error
    except (errors.RepositoryNotFoundError, errors.GatedRepoError) as error:
        raise FileNotFoundError(
            f"No repository {repo_id!r} on {constants.ENDPOINT}"
            ", or it is private or gated and "
            + (
                "the token given has no access to it."
                if token
                else "no token was given: pass token=... or log "
                "in with `hf auth login`."
            )
        ) from error
    except errors.LocalEntryNotFoundError as error:
        raise FileNotFoundError(
            f"{where} is not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and the Hub cannot "
            "be reached (offline mode, local_files_only=True or no "
            "network). Load it once online to cache it."
        ) from error
    except errors.EntryNotFoundError as error:
        raise FileNotFoundError(
            f"A file of {where} is missing on the Hub: {error}"
        ) from error
    except errors.HfHubHTTPError as error:
        response = getattr(error, "response", None)
        status = None if response is None else response.status_code
        if status not in (401, 403):
            raise
        raise PermissionError(
            f"The Hub rejected the token for {where} (HTTP {status}): "
            "check that it is valid and can read this repository."
        ) from error


def _is_translator(directory):
    """Whether ``directory`` holds a translator of format version 1, which
    only `push_to_hub` uploaded, always with a manifest. KerasHub presets
    (this package's included) are also uploaded by
    ``keras_hub.upload_preset``, without one, and load as KerasHub loads
    them."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        return False
    config = read_json(path)
    return isinstance(config, dict) and "format_version" in config


# --- pushing


def read_results(results):
    """A training record as a dict, from a dict, a `RunSummary`, a
    ``results.json`` file or a training run's output directory."""
    if results is None or isinstance(results, dict):
        return results
    if dataclasses.is_dataclass(results):
        return dataclasses.asdict(results)
    path = os.fspath(results)
    if os.path.isdir(path):
        path = os.path.join(path, RESULTS_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"No training results at {path!r}; pass the results.json of a "
            "training run (keras-transformer train writes it), its output "
            "directory, or a dict."
        )
    return read_json(path)


def load_card_settings(card=None, results=None):
    """Publishing settings for the model card (license, languages,
    datasets, tags, prose), from a dict or a JSON file; by default those
    of the recipe that trained the model (`SETTINGS_DIR`, the package's
    ``hub_settings/RECIPE.json``)."""
    if isinstance(card, dict):
        return dict(card)
    if card is not None:
        path = os.fspath(card)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"No model card settings at {path!r}; pass a JSON file like "
                "keras_transformer/hub_settings/multi30k_en_de.json, or a "
                "dict."
            )
        return read_json(path)
    recipe = (results or {}).get("recipe")
    if not recipe:
        return {}
    settings = SETTINGS_DIR.joinpath(f"{recipe}.json")
    if not settings.is_file():
        return {}
    with importlib.resources.as_file(settings) as path:
        return read_json(path)


def save_for_hub(
    translator, directory, repo_id, revision="main", results=None, card=None
):
    """Writes everything `push_to_hub` uploads into ``directory``:
    the saved translator, ``model.safetensors``, ``results.json``, the
    model card and the manifest."""
    from safetensors.numpy import save_file

    results = read_results(results)
    settings = load_card_settings(card, results)
    translator.save(directory)
    save_file(
        _weights_by_path(translator.model),
        os.path.join(directory, SAFETENSORS_FILE),
        # One key only: safetensors writes its metadata in hash-map
        # order, and a file that changes at every save is uploaded again.
        metadata={"format": "keras"},
    )
    if results is not None:
        write_json(os.path.join(directory, RESULTS_FILE), results)
    manifest = write_manifest(directory)
    with open(os.path.join(directory, CARD_FILE), "w", encoding="utf-8") as f:
        f.write(
            model_card(
                translator, repo_id, revision, results, settings, manifest
            )
        )


def _weights_by_path(model):
    import keras

    tensors = {}
    for variable in model.weights:
        name = variable.path
        if name in tensors:
            raise ValueError(
                f"Two weights of {model.name} share the path {name!r}; "
                "name the layers uniquely to save safetensors."
            )
        tensors[name] = keras.ops.convert_to_numpy(variable)
    return tensors


def push_to_hub(
    translator,
    repo_id,
    revision="main",
    commit_message=None,
    private=None,
    create_pr=False,
    token=None,
    results=None,
    card=None,
    tag=None,
):
    """Uploads a translator to the Hugging Face Hub in one commit.

    The repository is created if needed (``private`` applies then), and
    so is the branch ``revision``. Files that did not change are not
    uploaded again; when nothing changed, no commit is made and the
    current commit id is returned.

    Args:
        translator: the `Translator` to upload.
        repo_id: ``"owner/name"``.
        revision: the branch to commit to.
        commit_message: the commit's title.
        private: create the repository private (None: the Hub default).
        create_pr: open a pull request instead of committing to
            ``revision``.
        token: a Hub token with write access (default: the logged-in one).
        results: the training record for the model card: a training
            run's output directory, its ``results.json``, a dict or a
            `RunSummary` (`keras_transformer.training.run_recipe`).
        card: model card settings (a dict or JSON file, see
            ``keras_transformer/hub_settings/multi30k_en_de.json``);
            default: those of the recipe
            named in ``results``.
        tag: also tag the new commit (e.g. ``"v1.0"``).

    Returns:
        The id of the commit that holds the pushed files.
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    if is_hub_reference(repo_id):
        repo_id, _ = parse_reference(repo_id)
    api = HfApi(
        token=token,
        library_name="keras-transformer",
        library_version=__version__,
    )
    results = read_results(results)
    api.create_repo(repo_id, private=private, exist_ok=True)
    if revision != "main" and not create_pr:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="keras-transformer-") as folder:
        save_for_hub(translator, folder, repo_id, revision, results, card)
        names = _files(folder)
        operations = [
            CommitOperationAdd(
                path_in_repo=name,
                path_or_fileobj=os.path.join(folder, *name.split("/")),
            )
            for name in names
        ]
        # A translator saved in another layout or with another tokenizer
        # leaves no stale files.
        remote = api.list_repo_files(repo_id, revision=revision)
        operations += [
            CommitOperationDelete(path_in_repo=name)
            for name in remote
            if name not in names and _is_saved_entry(name)
        ]
        bleu = (results or {}).get("bleu")
        info = api.create_commit(
            repo_id,
            operations,
            commit_message=commit_message
            or f"Upload keras-transformer {__version__} translator",
            commit_description=None if bleu is None else f"BLEU {bleu:.2f}",
            revision=revision,
            create_pr=create_pr,
        )
    if tag is not None:
        api.create_tag(repo_id, tag=tag, revision=info.oid)
    return info.oid


# The files and folders that `Translator.save` writes, in either layout.
_SAVED_ENTRIES = (
    "tokenizer/",
    "assets/",
    "generation_config.json",
    "task.json",
    "preprocessor.json",
    "tokenizer.json",
    "metadata.json",
)


def _is_saved_entry(name):
    return any(
        name.startswith(entry) if entry.endswith("/") else name == entry
        for entry in _SAVED_ENTRIES
    )


# --- model card

_DEFAULT_SETTINGS = {
    "license": "unknown",
    "language": [],
    "datasets": [],
    "tags": [],
    "description": "",
    "example": "A man rides a bike.",
    "data_license": "Not recorded: see the licence of the training data.",
}


def model_card(
    translator,
    repo_id,
    revision="main",
    results=None,
    settings=None,
    manifest=None,
):
    """The ``README.md`` of a pushed translator: YAML metadata (library,
    languages, datasets, license, tags, ``model-index`` with BLEU) and a
    body with usage, architecture, training recipe, results, decoding
    settings and the data's licence."""
    from huggingface_hub import ModelCard

    settings = {**_DEFAULT_SETTINGS, **(settings or {})}
    results = results or {}
    recipe = results.get("recipe_settings") or {}
    name = settings.get("model_name") or repo_id.split("/")[-1]
    test_split = recipe.get("test_split") or settings.get("test_split")
    data = _card_data(settings, results, recipe, name, test_split)
    reference = f"hf://{repo_id}" + (
        "" if revision == "main" else f"@{revision}"
    )
    sections = [
        f"# {settings.get('title') or name}",
        settings["description"]
        or "A Transformer (Vaswani et al., 2017) translator trained with "
        "keras-transformer.",
        "## Usage",
        *_usage_section(reference, settings["example"]),
        "## Model",
        _table(_model_rows(translator)),
        "## Training recipe",
        _training_section(results, recipe),
        "## Results",
        _results_section(results, settings, test_split),
        "## Decoding",
        _table(list(translator.generation_config.to_dict().items())),
        "## Data and licence",
        settings["data_license"],
        _license_line(settings),
        "## Files",
        _files_section(manifest),
    ]
    if settings.get("citation"):
        sections += ["## Citation", f"```bibtex\n{settings['citation']}\n```"]
    content = f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n"
    return str(ModelCard(content))


def _card_data(settings, results, recipe, name, test_split):
    """The card's YAML metadata, with a ``model-index`` entry for the
    test BLEU when there is one."""
    from huggingface_hub import EvalResult, ModelCardData

    bleu = results.get("bleu")
    eval_results = None
    if bleu is not None:
        eval_results = [
            EvalResult(
                task_type="translation",
                task_name="Translation",
                dataset_type=(settings["datasets"] or [None])[0]
                or recipe.get("dataset", "unknown"),
                dataset_name=settings.get("dataset_name")
                or recipe.get("dataset", "unknown"),
                dataset_split=test_split,
                metric_type="bleu",
                metric_name="sacreBLEU",
                metric_value=round(float(bleu), 2),
                metric_config=results.get("bleu_signature"),
            )
        ]
    tags = ["keras", "keras-transformer", "translation", "transformer"]
    tags += [t for t in settings["tags"] if t not in tags]
    return ModelCardData(
        library_name="keras-hub",
        license=settings["license"],
        license_name=settings.get("license_name"),
        license_link=settings.get("license_link"),
        language=settings["language"] or None,
        datasets=settings["datasets"] or None,
        tags=tags,
        pipeline_tag="translation",
        model_name=name,
        metrics=["bleu"] if bleu is not None else None,
        eval_results=eval_results,
    )


def _usage_section(reference, example):
    return [
        "Runs on the TensorFlow, JAX and PyTorch backends "
        "(`KERAS_BACKEND`); `pip install keras-transformer`.",
        "```python\nimport keras_transformer as kt\n\n"
        f'translator = kt.Translator.from_pretrained("{reference}")\n'
        f"print(translator.translate([{example!r}]))\n"
        "```",
        "The files are a KerasHub preset, so KerasHub's task API loads "
        "them too (after `import keras_transformer`, which registers the "
        "classes):",
        "```python\nimport keras_hub\nimport keras_transformer\n\n"
        f'task = keras_hub.models.Seq2SeqLM.from_preset("{reference}")\n'
        f"print(task.generate({example!r}))\n"
        "```",
        "Or from the command line: "
        f"`keras-transformer pull {reference}`, then "
        "`keras-transformer translate --model DIR`.",
    ]


def _license_line(settings):
    name = settings.get("license_name")
    return (
        f"Model license: `{settings['license']}`"
        + (f" ({name})" if name else "")
        + "."
    )


def _table(rows):
    lines = ["| | |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in rows]
    return "\n".join(lines)


def _cell(value):
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_cell(v)}" for k, v in value.items())
    return "none" if value is None else str(value).replace("|", "\\|")


def _model_rows(translator):
    model = translator.model
    config = model.get_config()
    keys = (
        "num_encoder_layers",
        "num_decoder_layers",
        "hidden_dim",
        "num_heads",
        "intermediate_dim",
        "dropout",
        "vocabulary_size",
        "max_sequence_length",
    )
    rows = [(key, config[key]) for key in keys if key in config]
    rows.append(("parameters", f"{model.count_params():,}"))
    rows.append(("weights", _weights_description(translator)))
    rows.append(
        (
            "tokenizer",
            f"{translator.tokenizer.vocabulary_size} "
            "subword ids (SentencePiece)",
        )
    )
    return rows


def _weights_description(translator):
    if translator.quantization_mode == "int8":
        from keras_transformer.generation.quantization import (
            quantized_embeddings,
        )

        if quantized_embeddings(translator.model):
            embedding, floats = " and the shared embedding (per token)", ""
        else:
            embedding, floats = "", "the shared embedding, "
        return (
            'int8 with float32 scales (Keras `Model.quantize("int8")`): '
            "the kernels of the attention projections and feed-forward "
            f"networks (a scale per output unit){embedding}; {floats}"
            "biases and layer norms float32. `from_pretrained` loads them "
            "as int8"
        )
    return translator.model.dtype_policy.name


def _training_section(results, recipe):
    if not results:
        return "No training record was pushed with this model."
    rows = [
        ("recipe", results.get("recipe")),
        ("optimizer steps", results.get("steps")),
        ("training time", f"{results.get('train_minutes', 0):.1f} min"),
        ("stopped by the time limit", results.get("stopped_by_time_limit")),
        (
            "averaged checkpoints",
            ", ".join(results.get("averaged_checkpoints") or []) or None,
        ),
    ]
    rows += [(f"`{key}`", value) for key, value in sorted(recipe.items())]
    return (
        "Trained with `keras-transformer train --recipe "
        f"{results.get('recipe')}` (the paper's Adam schedule with warm-up, "
        "label smoothing and checkpoint averaging; sections 5.3, 5.4 and "
        "6.1). Hyperparameters:\n\n" + _table(rows)
    )


def _results_section(results, settings, test_split):
    bleu = results.get("bleu")
    if bleu is None:
        return "Not evaluated."
    dataset = settings.get("dataset_name") or (
        results.get("recipe_settings") or {}
    ).get("dataset", "the test set")
    recipe = results.get("recipe_settings") or {}
    return (
        f"| test set | BLEU | signature |\n|---|---|---|\n"
        f"| {dataset} {test_split or ''} | {bleu:.2f} | "
        f"`{_cell(results.get('bleu_signature'))}` |\n\n"
        "sacreBLEU on detokenized output; beam size "
        f"{recipe.get('beam_size', '?')}, length penalty "
        f"{recipe.get('length_penalty', '?')}."
    )


def _files_section(manifest):
    lines = [
        f"`{MANIFEST_FILE}` records the sha256 of every file; "
        "`Translator.from_pretrained` checks them all and refuses a "
        "corrupt or altered file.",
        "",
        "| file | bytes | sha256 |",
        "|---|---|---|",
    ]
    for name, record in sorted((manifest or {"files": {}})["files"].items()):
        lines.append(
            f"| `{name}` | {record['size']:,} | `{record['sha256'][:16]}…` |"
        )
    return "\n".join(lines)
