"""The streaming `keras-transformer translate` (chunks, progress, n-best,
sampling flags), `score`, `export`, `--quantize` and the checks of their
flags."""

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

from benchmarks import cli_memory
from keras_transformer import cli
from keras_transformer.generation import Translator

# The tiny untrained translator of the generation tests (batch size 2,
# at most input length + 4 tokens), saved once. Imported fixtures are
# requested as arguments of the same name, which ruff takes for
# redefinitions.
# ruff: noqa: F811
from tests.generation.conftest import (  # noqa: F401
    SENTENCES,
    saved_translator,
    tokenizer,
    translator,
)

LINES = [SENTENCES[0], "", SENTENCES[2], SENTENCES[4], SENTENCES[1]]


def _write_lines(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return str(path)


def _run(capsys, *argv):
    """``(status, stdout, stderr)`` of the command run in this process."""
    capsys.readouterr()
    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# --- streaming


def test_translate_streams_a_pipe_chunk_by_chunk(
    translator, saved_translator, tmp_path
):
    expected = translator.translate(LINES, beam_size=2, verbose=False)
    stderr_path = tmp_path / "stderr.txt"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keras_transformer.cli",
                "translate",
                "--model",
                str(saved_translator),
                "--beam-size",
                "2",
                "--chunk-size",
                "2",
                "--progress",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
    # Only a guard against a hang: kills the command if it never answers,
    # so that readline returns and the test fails instead of waiting.
    watchdog = threading.Timer(600, process.kill)
    watchdog.start()
    try:
        process.stdin.write(f"{LINES[0]}\n{LINES[1]}\n".encode())
        process.stdin.flush()
        # The first chunk's translations arrive while standard input is
        # still open: the command does not wait for the end of its input.
        first = [process.stdout.readline(), process.stdout.readline()]
        assert [line.decode() for line in first] == [
            f"{expected[0]}\n",
            f"{expected[1]}\n",
        ]
        assert process.poll() is None
        process.stdin.write("".join(f"{s}\n" for s in LINES[2:]).encode())
        process.stdin.close()
        rest = process.stdout.read().decode()
        assert process.wait() == 0, stderr_path.read_text()[-3000:]
    finally:
        watchdog.cancel()
    assert rest.split("\n")[:-1] == expected[2:]
    # --progress with stderr not a terminal: one plain line per chunk.
    errors = stderr_path.read_text()
    progress = re.findall(
        r"^(\d+) sentences translated, [\d.]+ sentences/s$",
        errors,
        flags=re.MULTILINE,
    )
    assert progress == ["2", "4", "5"]
    assert "\r" not in errors and "\x1b" not in errors


def test_progress_rewrites_one_line_on_a_terminal():
    stream = io.StringIO()
    progress = cli._Progress(stream, in_place=True)
    progress.update(1024)
    progress.update(7)
    progress.close()
    text = stream.getvalue()
    assert text.startswith("\r1024 sentences translated, ")
    assert text.count("\r") == 2 and text.endswith("\n")
    assert "\r1031 sentences translated, " in text
    assert text.count("\n") == 1
    assert progress.done == 1031


def test_chunks_never_read_past_the_chunk_they_return():
    read = []

    def lines():
        for i in range(5):
            read.append(i)
            yield str(i)

    chunks = cli._chunks(lines(), 2)
    assert next(chunks) == (0, ["0", "1"])
    assert read == [0, 1]
    assert list(chunks) == [(2, ["2", "3"]), (4, ["4"])]


def test_invalid_utf8_names_its_line(saved_translator, tmp_path, capsys):
    source = tmp_path / "latin1.txt"
    source.write_bytes(b"a dog\n\ncaf\xe9 au lait\n")
    status, out, err = _run(
        capsys,
        "translate",
        "--model",
        str(saved_translator),
        "--input",
        str(source),
    )
    assert status == 1 and out == ""
    assert err.count("\n") == 1
    assert f"--input {source}: line 3 is not valid UTF-8" in err
    assert "at byte 4 of the line" in err and "iconv" in err


def test_quiet_writes_nothing_to_stderr(
    translator, saved_translator, tmp_path, capsys
):
    source = _write_lines(tmp_path / "in.txt", LINES[:2])
    status, out, err = _run(
        capsys,
        "translate",
        "--model",
        str(saved_translator),
        "--input",
        source,
        "--quiet",
        "--method",
        "greedy",
    )
    assert status == 0 and err == ""
    assert out.split("\n")[:-1] == translator.translate(
        LINES[:2], method="greedy", verbose=False
    )


# --- n-best and scores


def test_n_best_lines_match_translate_with_scores(
    translator, saved_translator, tmp_path, capsys
):
    source = _write_lines(tmp_path / "in.txt", LINES[:4])
    status, out, _ = _run(
        capsys,
        "translate",
        "--model",
        str(saved_translator),
        "--input",
        source,
        "--n-best",
        "2",
        "--beam-size",
        "2",
        "--chunk-size",
        "3",
        "--quiet",
    )
    assert status == 0
    rows = [line.split(" ||| ") for line in out.split("\n")[:-1]]
    assert all(len(row) == 3 for row in rows)
    # Two lines per input line, INDEX its 0-based number, across chunks.
    assert [int(row[0]) for row in rows] == [0, 0, 1, 1, 2, 2, 3, 3]
    expected = translator.translate_with_scores(
        LINES[:4], verbose=False, beam_size=2, num_return_sequences=2
    )
    for index, hypotheses in enumerate(expected):
        printed = rows[2 * index : 2 * index + 2]
        assert [row[1] for row in printed] == [h.text for h in hypotheses]
        scores = [float(row[2]) for row in printed]
        np.testing.assert_allclose(
            scores, [h.score for h in hypotheses], atol=1e-4
        )
        assert scores == sorted(scores, reverse=True)
    # The empty line keeps its place with empty translations.
    assert rows[2:4] == [["1", "", "0.000000"]] * 2


def test_n_best_larger_than_the_saved_beam_is_one_clear_line(
    saved_translator, capsys
):
    # The saved beam size is the paper's 4; known only once loaded.
    status, out, err = _run(
        capsys, "translate", "--model", str(saved_translator), "--n-best", "5"
    )
    assert status == 1 and out == ""
    assert err.count("\n") == 1
    assert (
        "--n-best 5 needs a beam of at least 5, but the beam size is 4" in err
    )
    assert "--beam-size 5" in err


def test_score_matches_translator_score(
    translator, tokenizer, saved_translator, tmp_path, capsys
):
    # Targets short enough for the model's 7 tokens.
    sources = [SENTENCES[0], SENTENCES[3], SENTENCES[5]]
    targets = ["a dog", "two dogs play", SENTENCES[5]]
    status, out, _ = _run(
        capsys,
        "score",
        "--model",
        str(saved_translator),
        "--source",
        _write_lines(tmp_path / "source.txt", sources),
        "--target",
        _write_lines(tmp_path / "target.txt", targets),
        "--batch-size",
        "3",
    )
    assert status == 0
    printed = np.array(
        [[float(x) for x in line.split("\t")] for line in out.splitlines()]
    )
    assert printed.shape == (3, 2)
    np.testing.assert_allclose(
        printed, translator.score(sources, targets, batch_size=3), atol=1e-5
    )
    # The score is the log-probability over the GNMT length penalty of
    # the saved alpha 0.6, |Y| counting the end token.
    lengths = np.array([len(tokenizer.tokenize(t)) + 1 for t in targets])
    penalty = ((5.0 + lengths) / 6.0) ** 0.6
    np.testing.assert_allclose(
        printed[:, 0], printed[:, 1] / penalty, atol=1e-5
    )
    assert np.all(printed[:, 1] < 0)


def test_score_refuses_unequal_files(saved_translator, tmp_path, capsys):
    source = _write_lines(tmp_path / "source.txt", SENTENCES[:3])
    target = _write_lines(tmp_path / "target.txt", SENTENCES[:2])
    status, out, err = _run(
        capsys,
        "score",
        "--model",
        str(saved_translator),
        "--source",
        source,
        "--target",
        target,
    )
    assert status == 1 and out == ""
    assert err.count("\n") == 1
    assert f"--source {source} has 3 lines but --target {target} has 2" in err


# --- sampling


def _translate_lines(capsys, saved_translator, source, *flags):
    status, out, err = _run(
        capsys,
        "translate",
        "--model",
        str(saved_translator),
        "--input",
        source,
        "--quiet",
        *flags,
    )
    assert status == 0, err
    return out.split("\n")[:-1]


def test_sampling_flags_reach_the_search(
    translator, saved_translator, tmp_path, capsys
):
    source = _write_lines(tmp_path / "in.txt", SENTENCES)
    flags = ("--sample", "--seed", "7", "--temperature", "1.5")
    flags += ("--top-p", "0.5")
    sampled = _translate_lines(capsys, saved_translator, source, *flags)
    assert _translate_lines(capsys, saved_translator, source, *flags) == (
        sampled
    )
    # The near-uniform distributions of the untrained model: a top-p or
    # temperature that did not reach the search would draw other tokens.
    assert sampled == translator.translate(
        SENTENCES,
        method="sample",
        seed=7,
        temperature=1.5,
        top_p=0.5,
        verbose=False,
    )
    greedy = translator.translate(SENTENCES, method="greedy", verbose=False)
    assert sampled != greedy
    # One candidate token left: sampling is greedy search.
    assert greedy == _translate_lines(
        capsys, saved_translator, source, "--sample", "--top-k", "1"
    )


# --- bad flags


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["translate", "--n-best", "0"],
            "argument --n-best: '0' is not a positive integer; pass 1 or more",
        ),
        (
            ["translate", "--sample", "--top-p", "1.5"],
            r"argument --top-p: '1.5' is not in \(0, 1\]",
        ),
        (
            ["translate", "--sample", "--temperature", "0"],
            "argument --temperature: '0' is not a number above 0",
        ),
        (
            ["translate", "--sample", "--top-k", "0"],
            "argument --top-k: '0' is not a positive integer",
        ),
        (
            ["translate", "--quantize", "int3"],
            "--quantize int3: --engine keras quantizes to int8; pass one",
        ),
        (
            ["translate", "--chunk-size", "0"],
            "argument --chunk-size: '0' is not a positive integer",
        ),
        (
            ["translate", "--n-best", "3", "--beam-size", "2"],
            "--n-best 3 needs a beam of at least 3, but the beam size is 2; "
            "pass --beam-size 3",
        ),
        (
            ["translate", "--n-best", "2", "--method", "greedy"],
            "--n-best 2: greedy search gives one translation per line",
        ),
        (
            ["translate", "--top-k", "5"],
            "--top-k 5 applies to sampling only; add --sample",
        ),
        (
            ["translate", "--sample", "--method", "beam"],
            "--sample and --method beam disagree",
        ),
        (
            ["translate", "--progress", "--quiet"],
            "argument --quiet: not allowed with argument --progress",
        ),
        (
            ["evaluate", "--quantize", "int3"],
            "--quantize int3: --engine keras quantizes to int8; pass one",
        ),
        (
            ["export", "--output", "out", "--quantize", "int3"],
            "--quantize int3: --format savedmodel quantizes to int8; pass",
        ),
        (
            ["translate", "--engine", "ctranslate2", "--quantize", "int3"],
            "--quantize int3: --engine ctranslate2 quantizes to int8, "
            "int8_float32, int8_float16, int8_bfloat16, int16, float16, "
            "bfloat16, float32; pass one of them",
        ),
        (
            ["export", "--output", "out", "--format", "ctranslate2"]
            + ["--quantize", "int3"],
            "--quantize int3: --format ctranslate2 quantizes to int8, ",
        ),
        (
            ["translate", "--engine", "ctranslate2", "--plot-attention"]
            + ["a.png"],
            "--plot-attention needs the model's attention weights, which "
            "--engine ctranslate2 does not give",
        ),
        (
            ["average", "--last", "0"],
            "argument --last: '0' is not a positive integer",
        ),
        (
            ["average", "--last", "-1"],
            "argument --last: '-1' is not a positive integer",
        ),
        (
            ["score", "--source", "s", "--target", "t", "--chunk-size", "0"],
            "argument --chunk-size: '0' is not a positive integer",
        ),
    ],
)
def test_bad_flags_fail_before_loading_a_model(argv, message, tmp_path, capsys):
    # No model at --model: loading it would fail with another message.
    argv = [*argv, "--model", str(tmp_path / "no_model")]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"keras-transformer {argv[0]}: error: ")
    assert re.search(message, last), err


# --- export and quantize


def test_export_refuses_a_non_empty_directory(
    saved_translator, tmp_path, capsys
):
    output = tmp_path / "served"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    status, out, err = _run(
        capsys,
        "export",
        "--model",
        str(saved_translator),
        "--output",
        str(output),
    )
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{str(output)!r} exists and is not empty" in err
    assert "--overwrite" in err
    assert os.listdir(output) == ["keep.txt"]
    assert (output / "keep.txt").read_text() == "mine"


@pytest.mark.skipif(
    importlib.util.find_spec("keras_transformer.export") is None,
    reason="keras_transformer.export (behind Translator.export) is missing",
)
def test_export_writes_a_saved_model(saved_translator, tmp_path, capsys):
    output = tmp_path / "served"
    status, out, err = _run(
        capsys,
        "export",
        "--model",
        str(saved_translator),
        "--output",
        str(output),
        "--beam-size",
        "2",
    )
    assert status == 0, err
    assert out == f"{output}\n"
    assert (output / "saved_model.pb").is_file()


@pytest.mark.skipif(
    not hasattr(Translator, "quantize"),
    reason="Translator.quantize is missing",
)
def test_quantize_flag_quantizes_after_loading(
    translator, saved_translator, tmp_path, capsys
):
    quantized = Translator.from_pretrained(saved_translator, method="greedy")
    quantized.quantize("int8")
    expected = quantized.translate_with_scores(SENTENCES, verbose=False)
    source = _write_lines(tmp_path / "in.txt", SENTENCES)
    rows = [
        line.split(" ||| ")
        for line in _translate_lines(
            capsys,
            saved_translator,
            source,
            *("--method", "greedy", "--n-best", "1", "--quantize", "int8"),
        )
    ]
    assert [row[1] for row in rows] == [h[0].text for h in expected]
    scores = np.array([float(row[2]) for row in rows])
    np.testing.assert_allclose(
        scores, [h[0].score for h in expected], atol=1e-5
    )
    # The int8 weights score otherwise than the float ones.
    unquantized = translator.translate_with_scores(
        SENTENCES, method="greedy", verbose=False
    )
    assert np.abs(scores - [h[0].score for h in unquantized]).max() > 1e-4


# --- the memory benchmark


def test_memory_benchmark_smoke(tmp_path):
    path = tmp_path / "cli_memory.json"
    report = cli_memory.main(
        ["--smoke", "--threads", "0", "--output", str(path)]
    )
    assert json.loads(path.read_text()) == report
    short, long = report["runs"]
    assert (short["lines"], long["lines"]) == (24, 240)
    for run in report["runs"]:
        assert run["output_lines"] == run["lines"]
        # The framework alone takes well over 50 MB.
        assert run["peak_rss_mb"] > 50
    assert report["peak_ratio"] == pytest.approx(
        long["peak_rss_mb"] / short["peak_rss_mb"]
    )
