"""README.md's examples run, so that the README never goes stale.

Every ```python block of README.md runs (`test_python_block`), and so
does every ``keras-transformer`` command of its ```bash blocks
(`test_command_line_quickstart`); the set-up commands (pip, pytest) are
not run, but `test_setup_commands_are_the_ci_commands` checks them
against ``.ci/run``. Each Python block has a check in `PYTHON_CHECKS`,
found by a string the block contains, that asserts on the values the
block computed; a block without one fails, so that a new example comes
with its check.

What the tests change in the README's code, and why:

- Blocks run in a temporary working directory, so the files they write
  (``copy.keras``, ``runs/...``) land there.
- ``../shared/data/multi30k`` (the README's ``--data-dir``, relative to
  the repository root) becomes the absolute path of the project's copy of
  Multi30k; without it the command-line test skips.
- ``keras-transformer train`` gets `SHRINK_TRAIN` appended: a one-layer,
  32-wide model, a 600-piece vocabulary and 2 steps instead of the
  recipe's hour; ``evaluate`` gets ``--limit 4`` (4 test sentences).
- ``KERAS_BACKEND=...`` prefixes are dropped: the commands run in this
  process, under the test run's backend.
- ``hf://Helsinki-NLP/opus-mt-en-de`` comes from a local Hub server
  (`tests.hub.hub_server`) holding a tiny random Marian checkpoint
  (`tests.marian.conftest.write_checkpoint`), not from the Hub. That
  block runs in a fresh Python process whose ``HF_ENDPOINT`` and
  ``HF_HOME`` point at the server and at a temporary cache:
  huggingface_hub reads them when it is imported.
"""

import io
import json
import os
import re
import shlex
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

from tests.conftest import MULTI30K, REPO_ROOT
from tests.helpers import set_arguments, tiny_recipe_settings

README = REPO_ROOT / "README.md"
README_DATA_DIR = "../shared/data/multi30k"
OPUS_MT = "Helsinki-NLP/opus-mt-en-de"
HUB_TOKEN = "hf_readme_write_token"
SHRINK_TRAIN = [
    "--max-steps",
    "2",
    "--test-limit",
    "4",
    "--quiet",
    *set_arguments(tiny_recipe_settings(bleu_subset=4)),
]
SHRINK = {
    "train": SHRINK_TRAIN,
    "evaluate": ["--limit", "4", "--quiet"],
    "translate": ["--quiet"],
}


def code_blocks(language):
    """The README's fenced code blocks in ``language``, in order."""
    text = README.read_text(encoding="utf-8")
    pattern = rf"^```{language}\n(.*?)^```"
    return re.findall(pattern, text, flags=re.MULTILINE | re.DOTALL)


def cli_commands():
    """``(argv, stdin)`` of every ``keras-transformer`` command of the
    README's bash blocks: environment assignments before the command are
    dropped, and ``echo TEXT | keras-transformer ...`` feeds TEXT on
    standard input."""
    commands = []
    for block in code_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            stdin = None
            if "|" in words:
                split = words.index("|")
                echo, words = words[:split], words[split + 1 :]
                assert echo[0] == "echo", line
                stdin = " ".join(echo[1:]) + "\n"
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                words = words[1:]
            if words and words[0] == "keras-transformer":
                commands.append((words[1:], stdin))
    return commands


# --- Python blocks


def check_model_fit(namespace, tmp_path):
    model, inputs = namespace["model"], namespace["inputs"]
    logits = namespace["logits"]
    assert logits.shape == (256, 12, 1000)
    losses = model.history.history["loss"]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    # The saved model gives the same logits (on a few rows, to be quick).
    loaded = keras.saving.load_model(tmp_path / "copy.keras")
    rows = {name: value[:8] for name, value in inputs.items()}
    np.testing.assert_allclose(
        loaded.predict(rows, verbose=0), logits[:8], atol=1e-4
    )


def check_opus_mt(result, hub_server):
    (hub,) = result["hub"]
    assert isinstance(hub, str) and hub.strip(), result
    # The copy saved in this package's format translates the same.
    assert result["saved"] == result["hub"]
    downloads = [p for m, p in hub_server.requests if m == "GET"]
    assert any(f"/{OPUS_MT}/resolve/" in path for path in downloads)


# (a string the block contains, its check, whether it needs the Hub)
PYTHON_CHECKS = [
    ("model.fit(", check_model_fit, False),
    (f"hf://{OPUS_MT}", check_opus_mt, True),
]

# Runs after the Hub block in its process: what `check_opus_mt` reads.
HUB_REPORT = """
import json as _json

_saved = kt.Translator.from_pretrained("opus-mt-en-de")
_sentences = ["A man rides a bike."]
print("README-RESULT " + _json.dumps({
    "hub": translator.translate(_sentences, verbose=False),
    "saved": _saved.translate(_sentences, verbose=False),
}))
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def opus_mt_hub(tmp_path_factory):
    """A local Hub server with a tiny random Marian checkpoint at
    ``Helsinki-NLP/opus-mt-en-de``; yields the server."""
    pytest.importorskip("transformers")
    from huggingface_hub import HfApi

    from tests.hub.hub_server import HubServer
    from tests.marian.conftest import write_checkpoint

    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    directory = tmp_path_factory.mktemp("opus-mt") / "checkpoint"
    write_checkpoint(str(directory), MULTI30K)
    port = _free_port()
    server = HubServer(port, {HUB_TOKEN: "readme"}).start()
    api = HfApi(endpoint=server_endpoint(server), token=HUB_TOKEN)
    api.create_repo(OPUS_MT)
    api.upload_folder(repo_id=OPUS_MT, folder_path=str(directory))
    yield server
    server.stop()


def _run_with_hub(source, hub_server, tmp_path):
    """Runs ``source`` and `HUB_REPORT` in a fresh process that sees the
    local Hub; returns the report."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("HF_TOKEN", "HF_HUB_OFFLINE")
    }
    env.update(
        HF_ENDPOINT=server_endpoint(hub_server),
        HF_HOME=str(tmp_path / "hf-home"),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    script = tmp_path / "readme_block.py"
    script.write_text(source + HUB_REPORT, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("README-RESULT ")
    ]
    return json.loads(line[len("README-RESULT ") :])


def server_endpoint(server):
    return f"http://127.0.0.1:{server.server_address[1]}"


PYTHON_BLOCKS = code_blocks("python")


def test_the_readme_has_the_three_quickstarts():
    assert len(PYTHON_BLOCKS) >= 2
    assert {argv[0] for argv, _ in cli_commands()} >= {
        "train",
        "evaluate",
        "translate",
    }


@pytest.mark.parametrize(
    "index", range(len(PYTHON_BLOCKS)), ids=lambda i: f"python-{i + 1}"
)
def test_python_block(index, tmp_path, monkeypatch, request):
    source = PYTHON_BLOCKS[index]
    checks = [c for c in PYTHON_CHECKS if c[0] in source]
    assert len(checks) == 1, (
        "Each README Python block needs exactly one check in "
        f"PYTHON_CHECKS; block {index + 1} matches {len(checks)}:\n{source}"
    )
    _, check, needs_hub = checks[0]
    if needs_hub:
        server = request.getfixturevalue("opus_mt_hub")
        check(_run_with_hub(source, server, tmp_path), server)
        return
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    exec(compile(source, f"README.md[python {index + 1}]", "exec"), namespace)
    check(namespace, tmp_path)


# --- the command line


def _option(argv, name):
    return argv[argv.index(name) + 1]


@pytest.mark.slow  # trains, evaluates and translates: about a minute
def test_command_line_quickstart(tmp_path, monkeypatch, capsys):
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    from keras_transformer import cli
    from keras_transformer.generation import Translator

    monkeypatch.chdir(tmp_path)
    for argv, stdin in cli_commands():
        command = argv[0]
        argv = [str(MULTI30K) if a == README_DATA_DIR else a for a in argv]
        argv += SHRINK[command]
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin or ""))
        capsys.readouterr()
        assert cli.main(argv) == 0, (argv, capsys.readouterr().err)
        out = capsys.readouterr().out
        if command == "train":
            output = tmp_path / _option(argv, "--output")
            results = json.loads((output / "results.json").read_text())
            assert results["steps"] == 2
            assert 0.0 <= results["bleu"] <= 100.0
        elif command == "evaluate":
            assert "BLEU" in out and "nrefs:1" in out, out
            assert "(4 sentences)" in out, out
        elif command == "translate":
            translator = Translator.from_pretrained(_option(argv, "--model"))
            sentences = stdin.splitlines()
            expected = translator.translate(sentences, verbose=False)
            assert out.splitlines() == expected
        else:
            raise AssertionError(f"No check for `keras-transformer {command}`")


def test_setup_commands_are_the_ci_commands():
    """The README's install and test commands are the ones CI runs."""
    (install, test, *_) = code_blocks("bash")
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    torch_pin = re.search(r"pip install (torch==\S+)", install).group(1)
    assert f"pip install -q {torch_pin}" in ci
    assert 'pip install -e ".[jax,torch,test]"' in install
    assert '-e ".[jax,torch,test]"' in ci
    assert test.strip() == "KERAS_BACKEND=jax python -m pytest -q tests"
    assert "python -m pytest -q tests" in ci
