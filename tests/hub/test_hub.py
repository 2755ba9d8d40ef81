"""Push to and pull from a Hub over real HTTP: the real huggingface_hub
client against the local server of hub_server.py."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import yaml
from huggingface_hub import HfApi, ModelCard

import keras_transformer as kt
from keras_transformer import cli, hub
from tests.hub.conftest import SENTENCES, TOKEN, USER

REPO = f"{USER}/translator"


def _commit_posts(server):
    return [p for m, p in server.requests if m == "POST" and "/commit/" in p]


def _same_weights(a, b):
    return all(
        np.array_equal(x, y)
        for x, y in zip(
            a.model.get_weights(), b.model.get_weights(), strict=True
        )
    )


@pytest.fixture(scope="module")
def pushed(hub_server, hub_translator, run_results):
    """``REPO`` with two commits: v1 (tagged) and, on main, v2 with other
    weights. Returns their commit ids and reference translations."""
    model = hub_translator.model
    v1_weights = model.get_weights()
    v1 = hub_translator.push_to_hub(
        REPO, token=TOKEN, results=run_results, tag="v1"
    )
    v1_translations = hub_translator.translate(SENTENCES)
    model.set_weights([w * 1.5 for w in v1_weights])
    try:
        v2 = hub_translator.push_to_hub(REPO, token=TOKEN, results=run_results)
        v2_translations = hub_translator.translate(SENTENCES)
    finally:
        model.set_weights(v1_weights)
    assert v1_translations != v2_translations
    return {
        "v1": v1,
        "v2": v2,
        "v1_translations": v1_translations,
        "v2_translations": v2_translations,
    }


def test_push_is_one_commit_with_every_file(hub_server, pushed):
    api = HfApi(token=TOKEN)
    commits = api.list_repo_commits(REPO)
    # The repository's initial commit, then one commit per push.
    assert [c.commit_id for c in commits[:2]] == [pushed["v2"], pushed["v1"]]
    assert len(commits) == 3
    files = set(api.list_repo_files(REPO, revision=pushed["v1"]))
    assert files == {
        ".gitattributes",
        "README.md",
        "config.json",
        "manifest.json",
        "metadata.json",
        "model.weights.h5",
        "model.safetensors",
        "preprocessor.json",
        "results.json",
        "task.json",
        "tokenizer.json",
        "assets/tokenizer/vocabulary.spm",
    }
    # The weights went through the git-LFS batch API, not inline.
    tree = {
        f.path: f
        for f in api.list_repo_tree(REPO, revision=pushed["v1"])
        if hasattr(f, "lfs")
    }
    assert tree["model.weights.h5"].lfs is not None
    assert tree["config.json"].lfs is None


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_pushed_safetensors_hold_every_weight_exactly(
    pushed, hub_translator, version
):
    """model.safetensors on the Hub, read with the safetensors library
    alone, has one tensor per model weight under its Keras path, each
    equal to the weight bit for bit (v2 pushed the weights times 1.5)."""
    from safetensors.numpy import load_file

    directory = hub.resolve_directory(f"hf://{REPO}@{pushed[version]}")
    tensors = load_file(os.path.join(directory, "model.safetensors"))
    weights = hub_translator.model.weights
    assert sorted(tensors) == sorted(w.path for w in weights)
    assert len(tensors) == len(weights)
    for weight in weights:
        expected = keras.ops.convert_to_numpy(weight)
        if version == "v2":
            expected = expected * 1.5
        tensor = tensors[weight.path]
        assert tensor.dtype == expected.dtype, weight.path
        assert tensor.shape == expected.shape, weight.path
        np.testing.assert_array_equal(tensor, expected, err_msg=weight.path)


@pytest.mark.parametrize("pin", ["main", "tag", "commit", "revision="])
def test_pull_at_a_pinned_revision(pushed, hub_translator, pin):
    reference, version = {
        "main": (f"hf://{REPO}", "v2"),
        "tag": (f"hf://{REPO}@v1", "v1"),
        "commit": (f"hf://{REPO}@{pushed['v1']}", "v1"),
        "revision=": (f"hf://{REPO}", "v1"),
    }[pin]
    revision = "v1" if pin == "revision=" else None
    loaded = kt.Translator.from_pretrained(reference, revision=revision)
    expected = [
        w * 1.5 if version == "v2" else w
        for w in hub_translator.model.get_weights()
    ]
    for x, y in zip(loaded.model.get_weights(), expected, strict=True):
        np.testing.assert_array_equal(x, y)
    assert loaded.generation_config == hub_translator.generation_config
    assert loaded.tokenizer.tokenize(SENTENCES).to_list() == (
        hub_translator.tokenizer.tokenize(SENTENCES).to_list()
    )
    if pin == "tag":
        # Each load compiles its own search (seconds): one translates.
        assert loaded.translate(SENTENCES) == pushed["v1_translations"]


def test_pushing_unchanged_files_makes_no_commit(hub_server, hub_translator):
    repo = f"{USER}/unchanged"
    first = hub_translator.push_to_hub(repo, token=TOKEN)
    posts = len(_commit_posts(hub_server))
    again = hub_translator.push_to_hub(
        repo, token=TOKEN, commit_message="same files again"
    )
    assert again == first
    assert len(_commit_posts(hub_server)) == posts
    assert len(HfApi(token=TOKEN).list_repo_commits(repo)) == 2
    # A changed generation setting is a change: one new commit on top.
    changed = kt.Translator(
        hub_translator.model,
        hub_translator.tokenizer,
        hub_translator.generation_config,
        max_length=5,
    )
    third = changed.push_to_hub(repo, token=TOKEN)
    assert third != first
    commits = HfApi(token=TOKEN).list_repo_commits(repo)
    assert [c.commit_id for c in commits[:2]] == [third, first]
    # create_pr=True: the commit goes to a pull request, main stays.
    proposal = kt.Translator(
        hub_translator.model,
        hub_translator.tokenizer,
        hub_translator.generation_config,
        max_length=4,
    ).push_to_hub(repo, token=TOKEN, create_pr=True)
    api = HfApi(token=TOKEN)
    assert api.model_info(repo).sha == third
    refs = api.list_repo_refs(repo, include_pull_requests=True)
    assert [(r.ref, r.target_commit) for r in refs.pull_requests] == [
        ("refs/pr/1", proposal)
    ]
    loaded = hub.resolve_directory(f"hf://{repo}@refs/pr/1")
    task = json.loads(pathlib.Path(loaded, "task.json").read_text())
    assert task["config"]["generation_config"]["max_length"] == 4


def test_flipped_byte_in_the_cache_is_refused(hub_translator):
    repo = f"{USER}/corrupt"
    commit = hub_translator.push_to_hub(repo, token=TOKEN)
    directory = hub.resolve_directory(f"hf://{repo}@{commit}")
    # The snapshot links to a blob of the cache: damage the blob.
    blob = pathlib.Path(directory, "model.weights.h5").resolve()
    assert "blobs" in blob.parts
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    os.chmod(blob, 0o644)
    blob.write_bytes(bytes(data))
    with pytest.raises(hub.ChecksumError) as error:
        kt.Translator.from_pretrained(f"hf://{repo}@{commit}")
    message = str(error.value)
    assert "model.weights.h5" in message
    assert "corrupt or was altered" in message
    assert f"models--{USER}--corrupt" in message  # where to delete
    # The fix the message gives works: delete the cached copy, load again.
    shutil.rmtree(blob.parents[1])
    loaded = kt.Translator.from_pretrained(f"hf://{repo}@{commit}")
    assert _same_weights(loaded, hub_translator)


def test_file_altered_on_the_hub_is_refused(hub_translator):
    repo = f"{USER}/altered"
    hub_translator.push_to_hub(repo, token=TOKEN)
    # Someone replaces the tokenizer without updating the manifest.
    HfApi(token=TOKEN).upload_file(
        path_or_fileobj=b'{"vocabulary_size": 96}\n',
        path_in_repo="tokenizer.json",
        repo_id=repo,
    )
    with pytest.raises(hub.ChecksumError, match=r"^tokenizer\.json in "):
        kt.Translator.from_pretrained(f"hf://{repo}")


def test_cached_model_loads_without_the_network(
    hub_server, hub_translator, pushed
):
    before = len(hub_server.requests)
    loaded = kt.Translator.from_pretrained(
        f"hf://{REPO}@v1", local_files_only=True
    )
    assert len(hub_server.requests) == before  # not one request
    assert _same_weights(loaded, hub_translator)


def _load_in_subprocess(reference, backend):
    """Loads ``reference`` in a fresh process under ``backend`` with
    ``HF_HUB_OFFLINE=1`` and an endpoint nobody listens on."""
    script = (
        "import json, sys\n"
        "import keras_transformer as kt\n"
        f"t = kt.Translator.from_pretrained({reference!r})\n"
        f"print(json.dumps(t.translate({SENTENCES!r}, verbose=False)))\n"
    )
    env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        HF_HUB_OFFLINE="1",
        HF_ENDPOINT="http://127.0.0.1:9",
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# Each CI run loads the repository it pushed under another backend, so
# that over the three runs every backend loads weights another wrote.
NEXT_BACKEND = {"jax": "torch", "torch": "tensorflow", "tensorflow": "jax"}


@pytest.mark.slow  # a fresh process imports Keras, TensorFlow and compiles
def test_offline_process_on_another_backend_loads_the_cache(pushed):
    """A new process with HF_HUB_OFFLINE=1 (and no reachable endpoint),
    under another backend, loads the cached v1 and translates exactly as
    the pushed translator did."""
    other = NEXT_BACKEND[keras.backend.backend()]
    translations = _load_in_subprocess(f"hf://{REPO}@v1", other)
    assert translations == pushed["v1_translations"], other


def test_private_repository_needs_a_token(hub_translator):
    repo = f"{USER}/secret"
    hub_translator.push_to_hub(repo, token=TOKEN, private=True)
    with pytest.raises(FileNotFoundError, match="private") as error:
        kt.Translator.from_pretrained(f"hf://{repo}")
    assert "token" in str(error.value)
    with pytest.raises(PermissionError, match="rejected"):
        hub.resolve_directory(f"hf://{repo}", token="hf_not_a_token")
    directory = hub.resolve_directory(f"hf://{repo}", token=TOKEN)
    assert os.path.isfile(os.path.join(directory, "model.weights.h5"))


def test_model_card_renders_bleu_and_recipe(pushed, run_results):
    directory = hub.resolve_directory(f"hf://{REPO}@v1")
    card = ModelCard.load(os.path.join(directory, "README.md"))
    assert card.data.library_name == "keras-hub"
    assert card.data.language == ["en", "de"]
    assert card.data.datasets == ["bentrevett/multi30k"]
    assert "translation" in card.data.tags
    result = card.data.eval_results[0]
    assert (result.metric_type, result.metric_value) == ("bleu", 31.42)
    assert result.dataset_split == "test2016"
    # The same, read as plain YAML front matter.
    front = yaml.safe_load(card.content.split("---")[1])
    metrics = front["model-index"][0]["results"][0]["metrics"]
    assert metrics[0]["value"] == 31.42
    body = card.text
    recipe = run_results["recipe_settings"]
    for key in (
        "warmup_steps",
        "label_smoothing",
        "max_tokens",
        "vocabulary_size",
        "average_last",
    ):
        assert f"| `{key}` | {recipe[key]:g} |" in body, key
    assert "| Multi30k test2016 | 31.42 |" in body
    assert "| hidden_dim | 32 |" in body  # the pushed model's
    assert "non-commercial research" in body
    assert f'from_pretrained("hf://{REPO}")' in body
    manifest = json.loads(pathlib.Path(directory, "manifest.json").read_text())
    sha = manifest["files"]["model.weights.h5"]["sha256"]
    assert f"`{sha[:16]}…`" in body


@pytest.mark.parametrize(
    "settings",
    sorted(
        p.name for p in hub.SETTINGS_DIR.iterdir() if p.name.endswith(".json")
    ),
)
def test_publishing_settings_give_valid_cards(hub_translator, settings):
    """Every checkpoint's settings in keras_transformer/hub_settings/
    render a card the Hub's metadata parser accepts, for a recipe that
    exists."""
    from keras_transformer.training.recipes import RECIPES

    recipe = settings[: -len(".json")]
    assert recipe in RECIPES
    card_settings = hub.load_card_settings(results={"recipe": recipe})
    assert card_settings == json.loads(
        hub.SETTINGS_DIR.joinpath(settings).read_text()
    )
    text = hub.model_card(
        hub_translator,
        card_settings["repo_id"],
        results={"recipe": recipe, "bleu": 27.3, "bleu_signature": "s"},
        settings=card_settings,
    )
    card = ModelCard(text, ignore_metadata_errors=False)
    assert card.data.license == card_settings["license"]
    assert card.data.language == ["en", "de"]
    result = card.data.eval_results[0]
    assert result.metric_value == 27.3
    assert result.dataset_split == RECIPES[recipe].test_split


def test_clear_errors(hub_translator, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"No repository '{USER}/nope'"):
        kt.Translator.from_pretrained(f"hf://{USER}/nope")
    with pytest.raises(FileNotFoundError, match="has no revision 'v9'"):
        kt.Translator.from_pretrained(f"hf://{REPO}@v9")
    with pytest.raises(ValueError, match="hf://OWNER/NAME"):
        kt.Translator.from_pretrained("hf://just-a-name")
    with pytest.raises(ValueError, match="pins revision 'v1'"):
        kt.Translator.from_pretrained(f"hf://{REPO}@v1", revision="main")
    with pytest.raises(ValueError, match="local path"):
        kt.Translator.from_pretrained(str(tmp_path), revision="v1")

    # A repository whose manifest lists a file it lacks, then one with a
    # manifest from a future version.
    folder = tmp_path / "broken"
    hub.save_for_hub(hub_translator, folder, f"{USER}/broken")
    os.remove(folder / "assets" / "tokenizer" / "vocabulary.spm")
    api = HfApi(token=TOKEN)
    api.create_repo(f"{USER}/broken")
    missing = api.upload_folder(repo_id=f"{USER}/broken", folder_path=folder)
    with pytest.raises(
        FileNotFoundError, match="assets/tokenizer/vocabulary.spm"
    ):
        kt.Translator.from_pretrained(f"hf://{USER}/broken@{missing.oid}")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["format_version"] = 99
    future = api.upload_file(
        path_or_fileobj=json.dumps(manifest).encode(),
        path_in_repo="manifest.json",
        repo_id=f"{USER}/broken",
    )
    with pytest.raises(ValueError, match="format_version=99"):
        kt.Translator.from_pretrained(f"hf://{USER}/broken@{future.oid}")


def test_cli_push_and_pull(hub_translator, run_results, tmp_path, capsys):
    run = tmp_path / "run"
    hub_translator.save(run)
    (run / "results.json").write_text(json.dumps(run_results))
    code = cli.main(
        ["push", str(run), f"{USER}/cli", "--token", TOKEN, "--tag", "v1.0"]
    )
    assert code == 0
    commit = capsys.readouterr().out.strip()
    assert len(commit) == 40 and int(commit, 16) >= 0
    out = tmp_path / "pulled"
    assert cli.main(["pull", f"{USER}/cli@v1.0", "--output", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    # results.json of the run directory went into the card.
    card = ModelCard.load(out / "README.md")
    assert card.data.eval_results[0].metric_value == 31.42
    # The pulled folder is a verified translator directory.
    hub.verify_directory(out)
    data = bytearray((out / "model.safetensors").read_bytes())
    data[-1] ^= 0x10
    (out / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(hub.ChecksumError, match="model.safetensors"):
        kt.Translator.from_pretrained(out)
    # Errors a user can cause read as one line.
    assert cli.main(["pull", f"hf://{USER}/cli@nope"]) == 1
    assert "has no revision 'nope'" in capsys.readouterr().err
