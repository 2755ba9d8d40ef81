"""The `keras-transformer` command itself."""

import re
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


def _train_overrides(*items, max_steps=None):
    argv = ["train", "--recipe", "multi30k_en_de"]
    if max_steps is not None:
        argv += ["--max-steps", str(max_steps)]
    for item in items:
        argv += ["--set", item]
    max_steps, overrides = cli._recipe_overrides(
        cli.build_parser().parse_args(argv)
    )
    return overrides, max_steps


def test_a_dotted_model_setting_changes_one_argument():
    from keras_transformer.training import get_recipe

    overrides, _ = _train_overrides(
        "model.intermediate_dim=384", "model.dropout=0.2"
    )
    expected = dict(get_recipe("multi30k_en_de").model)
    assert expected["intermediate_dim"] != 384
    expected.update(intermediate_dim=384, dropout=0.2)
    assert overrides == {"model": expected}
    # On top of a whole model given as JSON, whatever the order.
    overrides, _ = _train_overrides(
        "model.num_heads=2", 'model={"hidden_dim": 64}'
    )
    assert overrides == {"model": {"hidden_dim": 64, "num_heads": 2}}


def test_max_steps_can_be_set_either_way_but_not_both():
    overrides, max_steps = _train_overrides("max_steps=7", "max_tokens=512")
    assert (overrides, max_steps) == ({"max_tokens": 512}, 7)
    assert _train_overrides(max_steps=9) == ({}, 9)
    with pytest.raises(ValueError, match="--max-steps 9 and --set max_steps=7"):
        _train_overrides("max_steps=7", max_steps=9)


@pytest.mark.parametrize(
    "item, message",
    [
        ("max_tokens.x=1", "only the model's arguments take a dotted key"),
        (
            "model.intermediate_size=512",
            r"Unknown model arguments \['intermediate_size'\]",
        ),
    ],
)
def test_bad_train_settings_fail_before_any_work(capsys, item, message):
    # --data-dir points at no corpus: the error must come first.
    status = cli.main(
        [
            "train",
            "--recipe",
            "multi30k_en_de",
            "--set",
            item,
            "--data-dir",
            ".",
        ]
    )
    assert status == 1
    err = capsys.readouterr().err
    assert re.search(message, err), err
