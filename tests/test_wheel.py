"""The built wheel is a complete package: installed into a fresh virtual
environment, away from the source tree, it renders a recipe's model card
with the publishing settings it ships as package data."""

import json
import os
import pathlib
import shutil
import site
import subprocess
import sys
import sysconfig
import textwrap

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = "multi30k_en_de"

# Run by the wheel's interpreter: builds a tiny translator and renders the
# card of a multi30k_en_de run with the settings the package ships.
_RENDER_CARD = textwrap.dedent(
    f"""
    import json

    import keras_transformer as kt
    from keras_transformer import hub
    from keras_transformer.data import train_tokenizer

    tokenizer = train_tokenizer(
        sentences=["a man rides a bike", "two dogs play in the snow"] * 20,
        vocabulary_size=40,
        byte_fallback=False,
    )
    model = kt.Transformer(
        vocabulary_size=tokenizer.vocabulary_size,
        num_encoder_layers=1,
        num_decoder_layers=1,
        hidden_dim=8,
        num_heads=2,
        intermediate_dim=16,
        max_sequence_length=8,
    )
    translator = kt.Translator(model, tokenizer, method="greedy")
    results = {{"recipe": "{SETTINGS}", "bleu": 30.5, "bleu_signature": "s"}}
    settings = hub.load_card_settings(results=results)
    card = hub.model_card(
        translator, settings["repo_id"], results=results, settings=settings
    )
    print(json.dumps({{"file": kt.__file__, "card": card}}))
    """
)


def _build_wheel(directory):
    """Builds the wheel from a copy of the sources: the build writes
    ``build/`` and ``*.egg-info`` into the tree it builds, where files of
    an earlier build (a module since deleted) would end up in the wheel,
    and where builds under the other backends may run at the same time."""
    source = directory / "source"
    source.mkdir()
    shutil.copy(REPO_ROOT / "pyproject.toml", source)
    shutil.copy(REPO_ROOT / "README.md", source)
    shutil.copytree(
        REPO_ROOT / "keras_transformer",
        source / "keras_transformer",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    dist = directory / "dist"
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--quiet",
        "-w",
        dist,
        source,
    )
    (wheel,) = dist.glob("keras_transformer-*.whl")
    return wheel


def _make_environment(directory, wheel):
    """A virtual environment with ``wheel`` installed that sees this
    interpreter's dependencies.

    ``--system-site-packages`` reaches the base interpreter's packages;
    when the tests run in a virtual environment, its site-packages are
    appended too, by a ``.pth`` file, so after the new environment's own.
    Directories named in a ``.pth`` file are not scanned for ``.pth``
    files themselves, so the source tree's editable install stays out.
    """
    environment = directory / "venv"
    _run(sys.executable, "-m", "venv", "--system-site-packages", environment)
    python = environment / "bin" / "python"
    # Before the dependencies are visible: pip then finds no installed
    # keras-transformer (the editable one) to replace or to keep.
    _run(python, "-m", "pip", "install", "--no-deps", "--no-index", wheel)
    purelib = _run(
        python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"
    ).strip()
    ours = {sysconfig.get_path("purelib"), *site.getsitepackages()}
    (pathlib.Path(purelib) / "tests_dependencies.pth").write_text(
        "".join(f"{path}\n" for path in sorted(ours) if os.path.isdir(path))
    )
    return environment, python


def _run(*command, cwd=None):
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")
    }
    process = subprocess.run(
        [os.fspath(c) for c in command],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environment,
        timeout=600,
    )
    assert process.returncode == 0, process.stderr[-4000:]
    return process.stdout


@pytest.mark.slow
def test_installed_wheel_renders_card_with_shipped_settings(tmp_path):
    wheel = _build_wheel(tmp_path)
    environment, python = _make_environment(tmp_path, wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # -I: neither the working directory nor PYTHONPATH on sys.path.
    output = _run(python, "-I", "-c", _RENDER_CARD, cwd=elsewhere)
    rendered = json.loads(output.strip().splitlines()[-1])

    package = pathlib.Path(rendered["file"]).resolve().parent
    assert package.is_relative_to(environment.resolve()), package
    assert not package.is_relative_to(REPO_ROOT), package
    assert (package / "hub_settings" / f"{SETTINGS}.json").is_file()
    expected = json.loads(
        (
            REPO_ROOT
            / "keras_transformer"
            / "hub_settings"
            / f"{SETTINGS}.json"
        ).read_text()
    )
    card = rendered["card"]
    assert f"# {expected['title']}\n" in card
    assert f"license_name: {expected['license_name']}\n" in card
    assert f"license_link: {expected['license_link']}\n" in card
    assert expected["data_license"] in card
    assert f'from_pretrained("hf://{expected["repo_id"]}")' in card
    assert f"- {expected['datasets'][0]}\n" in card
    assert "| Multi30k test2016 | 30.50 |" in card
