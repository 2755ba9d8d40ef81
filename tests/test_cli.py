"""The `keras-transformer` command itself."""

import subprocess
import sys

import pytest

from keras_transformer import __version__, cli


def test_version_and_help_in_process(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == f"keras-transformer {__version__}"
    assert cli.main([]) == 0
    help_text = capsys.readouterr().out
    for command in ("train", "evaluate", "average", "translate"):
        assert command in help_text


def test_console_script_runs():
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert __version__ in result.stdout


def test_bad_setting_is_one_clear_line(capsys):
    status = cli.main(
        [
            "train",
            "--recipe",
            "multi30k_en_de",
            "--set",
            "no_such=1",
            "--data-dir",
            ".",
        ]
    )
    assert status == 1
    err = capsys.readouterr().err
    assert "Unknown recipe settings ['no_such']" in err
