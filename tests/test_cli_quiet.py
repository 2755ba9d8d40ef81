"""`keras-transformer` starts light, stays quiet and fails in one line:
`--help` and `--version` import no framework, a redirected `train` log
has no progress-bar codes and no TensorFlow or CUDA lines, and errors a
user can cause (bad paths, Ctrl-C) print one line."""

import os
import signal
import subprocess
import sys

import pytest

from keras_transformer import cli
from tests.conftest import MULTI30K, REPO_ROOT
from tests.helpers import noisy_lines, set_arguments, tiny_recipe_settings

FRAMEWORKS = ("keras", "tensorflow", "jax", "torch")


def _python(code, env=None, **kwargs):
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=600,
        **kwargs,
    )


def test_help_and_version_import_no_framework():
    code = (
        "import sys\n"
        "from keras_transformer import cli\n"
        "for argv in (['--help'], ['train', '--help'], "
        "['translate', '--help'], ['--version']):\n"
        "    try:\n"
        "        cli.main(argv)\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, (argv, exit.code)\n"
        f"loaded = [m for m in {FRAMEWORKS!r} if m in sys.modules]\n"
        "print('LOADED', loaded, file=sys.stderr)\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "LOADED []" in result.stderr, result.stderr[-2000:]
    from keras_transformer._recipe_names import RECIPE_NAMES

    assert f"--recipe {{{','.join(RECIPE_NAMES)}}}" in result.stdout


def test_recipe_choices_are_the_recipes():
    from keras_transformer._recipe_names import RECIPE_NAMES
    from keras_transformer.training.recipes import RECIPES

    assert list(RECIPE_NAMES) == sorted(RECIPES)
    train = cli.build_parser()._subparsers._group_actions[0].choices["train"]
    (recipe,) = [a for a in train._actions if a.dest == "recipe"]
    assert list(recipe.choices) == sorted(RECIPES)


def test_public_names_still_resolve_lazily():
    code = (
        "import sys\n"
        "import keras_transformer as kt\n"
        "assert 'keras' not in sys.modules\n"
        "from keras_transformer import Transformer, Translator, layers\n"
        "from keras_transformer.models import Transformer as T\n"
        "assert kt.Transformer is Transformer is T\n"
        "assert kt.Translator is Translator\n"
        "assert kt.training.get_recipe('multi30k_en_de').name\n"
        "assert kt.layers is layers and kt.plot_attention\n"
        "assert set(kt.__all__) <= set(dir(kt))\n"
        "print('OK')\n"
    )
    result = _python(code)
    assert result.stdout.strip() == "OK", result.stderr[-2000:]


@pytest.mark.parametrize(
    "first_import",
    [
        "keras_transformer",
        "keras_transformer.layers",
        "keras_transformer.utils",
    ],
)
def test_a_saved_model_loads_after_a_lazy_import(first_import, tmp_path):
    """`keras.saving.load_model` finds the package's registered classes
    in a fresh process that imported the package (or one submodule) and
    Keras, and touched no model."""
    path = tmp_path / "model.keras"
    save = (
        "import keras_transformer as kt\n"
        "kt.Transformer(vocabulary_size=40, num_encoder_layers=1, "
        "num_decoder_layers=1, hidden_dim=16, num_heads=2, "
        f"intermediate_dim=32, max_sequence_length=8).save({str(path)!r})\n"
    )
    result = _python(save)
    assert result.returncode == 0, result.stderr[-2000:]
    load = (
        f"import {first_import}\n"
        "import keras\n"
        f"model = keras.saving.load_model({str(path)!r})\n"
        "print(type(model).__name__, model.hidden_dim)\n"
    )
    result = _python(load)
    assert result.stdout.strip() == "Transformer 16", result.stderr[-2000:]


@pytest.mark.parametrize("verbose", [False, True])
def test_quiet_settings_unless_verbose(verbose):
    """Without --verbose the command sets TensorFlow's log level (unless
    the user did) and hides Keras's shuffle warning, before any import."""
    flags = ["--verbose"] if verbose else []
    code = (
        "import os, sys, warnings\n"
        "from keras_transformer import cli\n"
        f"status = cli.main({flags!r} + ['score', '--model', 'm', "
        "'--source', 'missing.txt', '--target', 'missing.txt'])\n"
        "shuffle = any('shuffle=True' in str(f[1]) for f in warnings.filters)\n"
        "print(status, os.environ.get('TF_CPP_MIN_LOG_LEVEL'), shuffle)\n"
    )
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    result = _python(code, env=env)
    expected = "1 None False" if verbose else "1 3 True"
    assert result.stdout.strip() == expected, result.stderr[-2000:]
    # A level the user set stays.
    env["TF_CPP_MIN_LOG_LEVEL"] = "1"
    result = _python(code, env=env)
    assert result.stdout.split()[:2] == ["1", "1"], result.stderr[-2000:]


def test_search_flags_default_to_the_saved_settings(capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["translate", "--model", "m"])
    for name in ("beam_size", "length_penalty", "method", "batch_size"):
        assert getattr(args, name) is None, name
    with pytest.raises(SystemExit):
        parser.parse_args(["translate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "0.6" not in help_text
    assert help_text.count("default: the translator's saved generation") >= 4
    assert "(task.json)" in help_text


def test_fit_shows_bars_on_a_terminal_only():
    assert cli._fit_verbosity(quiet=False, terminal=True) == "auto"
    assert cli._fit_verbosity(quiet=False, terminal=False) == 2
    assert cli._fit_verbosity(quiet=True, terminal=True) == 0


# --- errors in one line


def _error_line(capsys, *argv):
    """``(status, the lines on stderr)`` of the command in this process."""
    capsys.readouterr()
    status = cli.main(list(argv))
    return status, capsys.readouterr().err.splitlines()


def test_translate_output_in_a_missing_directory_fails_first(tmp_path, capsys):
    # --model does not exist either: the output is checked before the
    # model loads, so before anything is translated.
    source = tmp_path / "in.txt"
    source.write_text("a dog\n", encoding="utf-8")
    output = tmp_path / "missing_dir" / "x.txt"
    status, err = _error_line(
        capsys,
        "translate",
        "--model",
        str(tmp_path / "no_model"),
        "--input",
        str(source),
        "--output",
        str(output),
    )
    assert status == 1
    assert err == [
        f"keras-transformer translate: error: --output {output}: the "
        f"directory {output.parent} does not exist; create it first or "
        "pass another path."
    ]
    assert not output.parent.exists()


@pytest.mark.parametrize("flag", ["--input", "--output"])
def test_a_directory_for_a_file_is_one_line(flag, tmp_path, capsys):
    argv = ["translate", "--model", str(tmp_path / "none"), flag, str(tmp_path)]
    status, err = _error_line(capsys, *argv)
    assert status == 1
    assert err == [
        f"keras-transformer translate: error: {flag} {tmp_path} is a "
        "directory; pass a file"
        + (" name." if flag == "--output" else ", one sentence per line.")
    ]


def test_an_os_error_deep_inside_names_its_file(tmp_path, capsys):
    # `evaluate` opens --source in the data reader: the IsADirectoryError
    # comes from open() itself and carries the file name.
    reference = tmp_path / "reference.txt"
    reference.write_text("ein Hund\n", encoding="utf-8")
    status, err = _error_line(
        capsys,
        "evaluate",
        "--model",
        str(tmp_path / "none"),
        "--source",
        str(tmp_path),
        "--reference",
        str(reference),
    )
    assert status == 1
    assert len(err) == 1, err
    assert err[0].startswith("keras-transformer evaluate: error: ")
    assert str(tmp_path) in err[0] and "directory" in err[0].lower()


def test_an_unwritable_output_is_one_line(tmp_path, capsys):
    # A process's /proc directory takes no new files, whatever the
    # permissions of the user (root included).
    locked = "/proc/self"
    if not os.path.isdir(locked):
        pytest.skip("no /proc on this system")
    assert not os.access(locked, os.W_OK)
    output = f"{locked}/out.txt"
    status, err = _error_line(
        capsys, "translate", "--model", "none", "--output", output
    )
    assert status == 1
    assert err == [
        f"keras-transformer translate: error: --output {output}: {locked} "
        "is not writable; pass another path."
    ]
    # An output whose folder is a file fails in one line as well.
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    output = a_file / "out.txt"
    status, err = _error_line(
        capsys, "translate", "--model", "none", "--output", str(output)
    )
    assert status == 1
    assert len(err) == 1, err
    assert err[0].startswith(
        f"keras-transformer translate: error: --output {output}: "
    )
    assert str(a_file) in err[0].partition(f"{output}: ")[2]
    assert not a_file.read_text()


def test_debug_shows_the_traceback(tmp_path):
    output = tmp_path / "missing_dir" / "x.txt"
    argv = ["translate", "--model", "none", "--output", str(output)]
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        cli.main(["--debug", *argv])
    # After the command as well.
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        cli.main([*argv, "--debug"])


# --- a real training run, redirected


@pytest.fixture(scope="module")
def small_multi30k(tmp_path_factory):
    """The first 2,000 training lines of Multi30k and 200 of each other
    split."""
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    directory = tmp_path_factory.mktemp("multi30k")
    for split, count in (("train", 2000), ("valid", 200), ("test", 200)):
        for language in ("en", "de"):
            name = f"{split}.{language}"
            with open(MULTI30K / name, encoding="utf-8") as f:
                lines = [next(f) for _ in range(count)]
            (directory / name).write_text("".join(lines), encoding="utf-8")
    return directory


def _train_argv(data_dir, output, max_steps, test_limit=4):
    settings = tiny_recipe_settings(bleu_subset=4)
    argv = [
        sys.executable,
        "-m",
        "keras_transformer.cli",
        "train",
        "--recipe",
        "multi30k_en_de",
        "--data-dir",
        str(data_dir),
        "--output",
        str(output),
        "--max-steps",
        str(max_steps),
        "--test-limit",
        str(test_limit),
        *set_arguments(settings),
    ]
    return argv


def _plain_env():
    # The test configuration quiets TensorFlow; the command must do it.
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


@pytest.mark.slow
def test_a_redirected_train_log_is_plain(small_multi30k, tmp_path):
    log = tmp_path / "train.log"
    with open(log, "wb") as f:
        result = subprocess.run(
            # 40 test sentences: more than a batch of the translator
            # (32), where a terminal would get a progress bar.
            _train_argv(small_multi30k, tmp_path / "run", 4, test_limit=40),
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env=_plain_env(),
            timeout=900,
        )
    text = log.read_text(encoding="utf-8", errors="replace")
    assert result.returncode == 0, text[-3000:]
    assert "\x1b" not in text and "\r" not in text
    # No TensorFlow, CUDA or tensorflow-text SentencePiece lines. The
    # run's own paths may hold a backend's name (CI's temporary folders
    # do): they are not noise.
    assert noisy_lines(text, tmp_path) == []
    # Nor Keras's warning about the shuffle of a tf.data.Dataset.
    assert "shuffle=True" not in text
    lines = text.splitlines()
    # Keras's verbose=2: one line per epoch of 2 steps.
    epochs = [line for line in lines if line.startswith("2/2 - ")]
    assert len(epochs) == 2, text
    assert "steps:       4" in text


@pytest.mark.slow
def test_ctrl_c_during_train_is_one_line_and_exit_130(small_multi30k, tmp_path):
    process = subprocess.Popen(
        _train_argv(small_multi30k, tmp_path / "run", 2000),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
        env=_plain_env(),
    )
    try:
        # The first epoch's line: training has started and finished one
        # epoch, so the run has a checkpoint to resume from.
        for line in process.stdout:
            if line.startswith(b"2/2 - "):
                break
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=600)
    finally:
        process.kill()
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert process.returncode == 130, lines[-20:]
    assert len(lines) == 1, lines[-20:]
    assert lines[0].startswith("keras-transformer train: error: ")
    assert "resume" in lines[0]
