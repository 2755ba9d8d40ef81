"""`keras-transformer translate`, in-process and as a command."""

import io
import os
import subprocess
import sys

import keras
import pytest

from keras_transformer import cli
from tests.generation.conftest import SENTENCES
from tests.helpers import noisy_lines


def test_help_and_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["translate", "--help"])
    assert exit_info.value.code == 0
    assert "--beam-size" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert "keras-transformer" in capsys.readouterr().out


def test_translate_file(translator, saved_translator, tmp_path, capsys):
    source = tmp_path / "source.txt"
    lines = [SENTENCES[0], "", SENTENCES[2]]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "out.txt"
    reference = tmp_path / "reference.txt"
    expected = translator.translate(lines)
    reference.write_text("\n".join(expected) + "\n", encoding="utf-8")
    status = cli.main(
        [
            "translate",
            "--model",
            str(saved_translator),
            "--input",
            str(source),
            "--output",
            str(output),
            "--reference",
            str(reference),
        ]
    )
    assert status == 0
    assert output.read_text(encoding="utf-8").split("\n")[:-1] == expected
    assert "BLEU = " in capsys.readouterr().err


def test_translate_stdin(translator, saved_translator, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(SENTENCES[1] + "\n"))
    status = cli.main(
        ["translate", "--model", str(saved_translator), "--beam-size", "2"]
    )
    assert status == 0
    expected = translator.translate(SENTENCES[1], beam_size=2)
    assert capsys.readouterr().out == expected + "\n"


def test_missing_model_is_a_clear_error(tmp_path, capsys):
    status = cli.main(["translate", "--model", str(tmp_path / "none")])
    assert status == 1
    assert "Translator.save" in capsys.readouterr().err


@pytest.mark.slow
def test_command_under_another_backend(translator, saved_translator):
    # Saved under this backend, loaded and run under another one.
    # The child runs torch or JAX: no TensorFlow import or XLA compile.
    other = {"jax": "torch", "torch": "jax", "tensorflow": "torch"}[
        keras.backend.backend()
    ]
    env = dict(os.environ, KERAS_BACKEND=other, TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_transformer.cli",
            "translate",
            "--model",
            str(saved_translator),
            "--beam-size",
            "2",
        ],
        input="\n".join(SENTENCES[:3]) + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr
    expected = translator.translate(SENTENCES[:3], beam_size=2)
    assert process.stdout.split("\n")[:-1] == expected


def test_undecodable_standard_input_names_line_and_byte(
    saved_translator, monkeypatch, capsys
):
    data = b"a dog\n" + "caf\xe9 au lait\n".encode("latin-1")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    status = cli.main(["translate", "--model", str(saved_translator)])
    assert status == 1
    assert capsys.readouterr().err.splitlines() == [
        "keras-transformer translate: error: --input (standard input): "
        "line 2 is not valid UTF-8 (invalid continuation byte at byte 4 of "
        "the line); convert the file to UTF-8, e.g. iconv -f latin1 -t "
        "utf-8."
    ]


def test_plot_attention_rows_are_the_generated_tokens(
    translator, saved_translator, tmp_path, capsys
):
    """One heatmap row per generated token and the end token (at most
    the model's max_sequence_length): the translation's ids, not its
    text tokenized again."""
    source = tmp_path / "source.txt"
    lines = [SENTENCES[4], "", SENTENCES[0]]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    status = cli.main(
        [
            "translate",
            "--model",
            str(saved_translator),
            "--input",
            str(source),
            "--output",
            str(tmp_path / "out.txt"),
            "--plot-attention",
            str(tmp_path / "attention.png"),
        ]
    )
    assert status == 0
    err = capsys.readouterr().err.splitlines()
    rows = translator.translate_with_scores([lines[0], lines[2]], verbose=False)
    limit = translator.model.max_sequence_length
    expected = []
    for line, (best,) in zip((1, 3), rows, strict=True):
        target = min(len(best.token_ids) + 1, limit)
        source_tokens = len(translator.tokenizer.encode(lines[line - 1])) + 1
        expected.append(
            f"Attention of line {line}: {tmp_path}/attention-{line}.png "
            f"({target} target by {source_tokens} source tokens)"
        )
        assert (tmp_path / f"attention-{line}.png").stat().st_size > 0
    assert err == expected
    # The rows are the generated ids' pieces; the old ones came from the
    # written text tokenized again, another sequence.
    tokenizer = translator.tokenizer
    ((line, sentence, written),) = cli._chunk_attention(
        translator, 0, [lines[0]], rows[:1]
    )
    ids = list(rows[0][0].token_ids)
    assert (line, written) == (0, rows[0][0].text)
    pieces = tokenizer.id_to_token([tokenizer.start_id, *ids])[:limit]
    assert sentence.target_tokens == [str(p) for p in pieces]
    assert len(sentence.cross_attention[0, 0]) == min(len(ids) + 1, limit)
    assert tokenizer.encode(rows[0][0].text) != ids


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_length_penalty_fails_before_loading(
    value, tmp_path, capsys
):
    # There is no translator at --model: the flag is refused first.
    status = cli.main(
        [
            "translate",
            "--model",
            str(tmp_path / "none"),
            "--length-penalty",
            value,
        ]
    )
    assert status == 1
    assert capsys.readouterr().err.splitlines() == [
        f"keras-transformer translate: error: length_penalty={value} must be "
        "a finite number (0.6 in the paper; 0 disables it)."
    ]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_tensorflow_writes_nothing_to_a_redirected_log_unless_verbose(
    command, translator, saved_translator, tmp_path
):
    # On the TensorFlow backend, whichever backend saved the translator:
    # there the command imports TensorFlow, whose libraries log.
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES[:3]) + "\n", encoding="utf-8")
    files = ["--input", str(source)]
    if command == "evaluate":
        files = ["--source", str(source), "--reference", str(source)]
    environment = dict(os.environ, KERAS_BACKEND="tensorflow")
    # The test configuration quiets TensorFlow; the command must do it.
    environment.pop("TF_CPP_MIN_LOG_LEVEL", None)
    logs = {}
    for flags in ([], ["--verbose"]):
        log = tmp_path / f"{command}{''.join(flags)}.log"
        with open(log, "wb") as stderr:
            result = subprocess.run(
                [sys.executable, "-m", "keras_transformer.cli", *flags]
                + [command, "--model", str(saved_translator), *files],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=environment,
                timeout=600,
            )
        logs[tuple(flags)] = log.read_text(encoding="utf-8", errors="replace")
        assert result.returncode == 0, logs[tuple(flags)][-3000:]
        output = result.stdout.decode().splitlines()
        if command == "translate":
            assert output == translator.translate(SENTENCES[:3])
        else:
            assert (
                output[0].startswith("BLEU = ") and "(3 sentences)" in output[0]
            )
    own = (tmp_path, saved_translator)
    assert noisy_lines(logs[()], *own) == []
    # Three sentences are two batches of the fixture's translator, which
    # a terminal would see as a progress bar; a redirected log has none.
    assert "\r" not in logs[()] and "\x1b" not in logs[()]
    # --verbose lets them through.
    assert noisy_lines(logs[("--verbose",)], *own) != []
