"""The CTranslate2 export: a translator written by CTranslate2's converter
API and decoded by ``ctranslate2.Translator`` gives the strings of
`Translator.translate` (greedy, and beam 4 with the ``"hf"`` length
penalty, CTranslate2's) and the scores of `Translator.score`, for a
trained tiny translator, a converted Marian model, a pre-norm model and
a model with separate source and target vocabularies; int8 exports; the
command line's ``--engine ctranslate2`` and ``export --format
ctranslate2``, and their refusals."""

import json
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import cli
from keras_transformer.ctranslate2_engine import (
    CTranslate2Translator,
    export_ctranslate2,
    transformer_spec,
)

# Imported fixtures are requested as arguments of the same name, which
# ruff takes for redefinitions.
# ruff: noqa: F811
from tests.generation.conftest import (  # noqa: F401
    SENTENCES,
    build_tiny_model,
    tokenizer,
    train_reversal_model,
)
from tests.marian.conftest import (  # noqa: F401
    marian_checkpoint,
    mixed_batch,
)

# Far more subword tokens than the tiny models' max_sequence_length, and
# longer than any training sentence: truncated, with a warning.
LONG = " and ".join(SENTENCES)
BATCH = ["", "a dog", LONG, " \t\u3000", "a man rides a bike", SENTENCES[1]]
# The two searches CTranslate2 decodes exactly as `Translator` does. Its
# beam search stops when beam_size hypotheses have finished
# (transformers' early_stopping=True) and renormalizes after removing
# the banned tokens.
SEARCHES = {
    "greedy": dict(method="greedy", renormalize=True),
    "beam_hf": dict(
        method="beam",
        beam_size=4,
        length_penalty=1.0,
        length_penalty_style="hf",
        early_stopping=True,
        renormalize=True,
    ),
}
# Scores are float32 sums on two engines.
SCORE_TOLERANCE = 1e-4


def _random_translator(tokenizer, seed, **options):
    """An untrained tiny model with weights scaled up, so that its
    distributions are peaked and depend on the prefix: beam search and
    greedy search disagree, and outputs run to different lengths."""
    model = build_tiny_model(
        seed=seed,
        vocabulary_size=tokenizer.vocabulary_size,
        max_sequence_length=16,
        **options,
    )
    for variable in model.weights:
        if variable.path.endswith(("kernel", "embeddings")):
            variable.assign(keras.ops.convert_to_numpy(variable) * 3.0)
    return kt.Translator(model, tokenizer, max_length_offset=6, batch_size=4)


@pytest.fixture(scope="module")
def translators(tokenizer, marian_checkpoint):
    """``{name: (translator, batch)}``: the models the export serves."""
    trained = kt.Translator(
        train_reversal_model(tokenizer),
        tokenizer,
        max_length_offset=4,
        batch_size=2,
    )
    sentences = marian_checkpoint["sentences"]
    marian_batch = mixed_batch(sentences)
    marian = kt.Translator.from_pretrained(
        marian_checkpoint["directory"], max_length=14, batch_size=4
    )
    separate = dict(
        target_vocabulary_size=tokenizer.vocabulary_size,
        share_embeddings=False,
        tie_output_embeddings=False,
    )
    return {
        "trained": (trained, BATCH),
        "marian": (marian, marian_batch),
        "pre_norm": (
            _random_translator(tokenizer, 3, normalize_first=True),
            BATCH,
        ),
        "separate_vocabularies": (
            _random_translator(tokenizer, 4, **separate),
            BATCH,
        ),
    }


@pytest.fixture(scope="module")
def exports(translators, tmp_path_factory):
    root = tmp_path_factory.mktemp("ctranslate2")
    return {
        name: export_ctranslate2(translator, root / name)
        for name, (translator, _) in translators.items()
    }


def _translate(translator, batch, **settings):
    """Best hypotheses, warning (once per engine) of the long sentence."""
    with pytest.warns(UserWarning, match="truncated"):
        return [
            row[0]
            for row in translator.translate_with_scores(
                batch, verbose=False, **settings
            )
        ]


def test_the_models_are_the_four_kinds(translators):
    """The fixtures cover what the export must serve."""
    models = {name: t.model for name, (t, _) in translators.items()}
    assert models["pre_norm"].normalize_first
    assert models["pre_norm"].encoder_final_norm is not None
    assert not models["trained"].normalize_first
    separate = models["separate_vocabularies"]
    assert (
        separate.encoder_token_embedding is not separate.decoder_token_embedding
    )
    assert separate.output_projection is not None
    assert models["marian"].output_bias is not None
    assert models["marian"].activation == "silu"
    assert (
        models["trained"].encoder_token_embedding
        is models["trained"].decoder_token_embedding
    )


@pytest.mark.parametrize("search", sorted(SEARCHES))
@pytest.mark.parametrize(
    "name", ["trained", "marian", "pre_norm", "separate_vocabularies"]
)
def test_export_translates_like_the_translator(
    translators, exports, name, search
):
    translator, batch = translators[name]
    settings = SEARCHES[search]
    served = CTranslate2Translator(exports[name])
    theirs = _translate(served, batch, **settings)
    ours = _translate(translator, batch, **settings)
    assert [h.text for h in theirs] == [h.text for h in ours]
    assert [h.token_ids for h in theirs] == [h.token_ids for h in ours]
    np.testing.assert_allclose(
        [h.score for h in theirs],
        [h.score for h in ours],
        rtol=0,
        atol=SCORE_TOLERANCE,
    )
    # Real outputs: empty sentences give "", the others translate, and
    # not all alike.
    blank = [i for i, s in enumerate(batch) if not s.strip()]
    assert blank and all(theirs[i].text == "" for i in blank)
    texts = {h.text for i, h in enumerate(theirs) if i not in blank}
    assert len(texts - {""}) >= 2


def test_beam_and_greedy_differ_on_some_model(translators, exports):
    """The beam test can fail: on these models beam search does not
    merely repeat greedy search."""
    differ = 0
    for name, (_, batch) in translators.items():
        served = CTranslate2Translator(exports[name])
        greedy = _translate(served, batch, **SEARCHES["greedy"])
        beam = _translate(served, batch, **SEARCHES["beam_hf"])
        differ += sum(
            g.text != b.text for g, b in zip(greedy, beam, strict=True)
        )
    assert differ >= 2


@pytest.mark.parametrize(
    "name", ["trained", "marian", "pre_norm", "separate_vocabularies"]
)
def test_score_batch_scores_like_the_model(translators, exports, name):
    translator, batch = translators[name]
    served = CTranslate2Translator(exports[name])
    sources = [s for s in batch if s.strip()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        targets = translator.translate(sources, verbose=False, method="greedy")
        targets = [targets[-1]] + targets[:-1]  # also poor translations
        ours = translator.score(sources, targets)
        theirs = served.score(sources, targets)
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=SCORE_TOLERANCE)
    assert len({round(p, 3) for _, p in ours}) == len(ours)


def test_the_gnmt_penalty_and_other_stopping_rules_are_named(
    translators, exports
):
    """Settings CTranslate2 decodes differently say so, once."""
    translator, batch = translators["trained"]
    assert translator.generation_config.length_penalty_style == "gnmt"
    served = CTranslate2Translator(exports["trained"])
    with pytest.warns(UserWarning, match="no GNMT length penalty"):
        served.translate(batch[:2], verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        served.translate(batch[:2], verbose=False)
    with pytest.warns(UserWarning, match="early_stopping=False"):
        served.translate(
            batch[:2],
            verbose=False,
            length_penalty_style="hf",
            early_stopping=False,
        )


def test_sources_past_the_position_table_are_truncated_as_translator_does(
    translators, exports
):
    translator, _ = translators["trained"]
    served = CTranslate2Translator(exports["trained"])
    table = transformer_spec(translator).encoder.position_encodings.encodings
    limit = translator.max_sequence_length
    assert table.shape[0] == limit
    assert len(translator.tokenizer.encode([LONG])[0]) > limit
    with pytest.warns(UserWarning, match=f"truncated to {limit - 1} tokens"):
        served.translate(LONG, verbose=False)
    with pytest.raises(ValueError, match="Split long sentences"):
        served.translate(LONG, verbose=False, long_inputs="error")


def test_export_files_and_settings(translators, exports):
    translator, _ = translators["trained"]
    directory = exports["trained"]
    names = set(os.listdir(directory))
    assert {"model.bin", "config.json", "keras_transformer.json"} <= names
    assert "tokenizer" in names and "shared_vocabulary.json" in names
    with open(os.path.join(directory, "keras_transformer.json")) as f:
        metadata = json.load(f)
    assert metadata["quantization"] == "float32"
    assert metadata["max_sequence_length"] == translator.max_sequence_length
    assert (
        metadata["generation_config"] == translator.generation_config.to_dict()
    )
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    assert config["add_source_eos"] is True
    assert config["layer_norm_epsilon"] == 1e-5
    served = CTranslate2Translator(directory, beam_size=2)
    assert served.generation_config.beam_size == 2
    assert served.generation_config.length_penalty == 0.6


# --- int8


INT8_SENTENCES = (
    SENTENCES
    + [" ".join(s.split()[::-1]) for s in SENTENCES]
    + [" ".join(s.split()[:3]) for s in SENTENCES]
)


def test_int8_exports_translate_like_the_float32_export(
    translators, exports, tmp_path
):
    translator, _ = translators["trained"]
    float32 = CTranslate2Translator(exports["trained"], method="greedy")
    int8_path = export_ctranslate2(translator, tmp_path / "int8", "int8")
    int8 = CTranslate2Translator(int8_path, method="greedy")
    quantized = kt.Translator(
        kt.Transformer.from_config(translator.model.get_config()),
        translator.tokenizer,
        translator.generation_config,
    )
    quantized.model.set_weights(translator.model.get_weights())
    quantized.quantize("int8")
    # An int8 translator exports as int8 by default.
    keras_int8 = CTranslate2Translator(
        export_ctranslate2(quantized, tmp_path / "keras_int8"),
        method="greedy",
    )
    for path in (int8_path, tmp_path / "keras_int8"):
        with open(os.path.join(path, "keras_transformer.json")) as f:
            assert json.load(f)["quantization"] == "int8"
        assert os.path.getsize(os.path.join(path, "model.bin")) < 0.6 * (
            os.path.getsize(os.path.join(exports["trained"], "model.bin"))
        )
    reference = float32.translate(INT8_SENTENCES, verbose=False)
    assert len(set(reference)) >= len(SENTENCES)
    for served in (int8, keras_int8):
        same = sum(
            a == b
            for a, b in zip(
                served.translate(INT8_SENTENCES, verbose=False),
                reference,
                strict=True,
            )
        )
        assert same >= 0.9 * len(INT8_SENTENCES), same


# --- the Python API's refusals


def test_export_refuses_bad_arguments_before_any_work(translators, tmp_path):
    translator, _ = translators["trained"]
    output = tmp_path / "served"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="exists and is not empty"):
        translator.export(output, format="ctranslate2")
    assert os.listdir(output) == ["keep.txt"]
    with pytest.raises(ValueError, match="quantization='int3' is not one of"):
        translator.export(
            tmp_path / "a", format="ctranslate2", quantization="int3"
        )
    with pytest.raises(ValueError, match="format='onnx' is not one of"):
        translator.export(tmp_path / "b", format="onnx")
    with pytest.raises(ValueError, match='applies to format="ctranslate2"'):
        translator.export(tmp_path / "c", quantization="int8")
    assert sorted(os.listdir(tmp_path)) == ["served"]
    translator.export(output, format="ctranslate2", overwrite=True)
    assert "keep.txt" not in os.listdir(output)
    with pytest.raises(FileNotFoundError, match="is not a CTranslate2 export"):
        CTranslate2Translator(tmp_path)


# --- the command line


def _run(capsys, *argv):
    capsys.readouterr()
    status = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture(scope="module")
def saved_greedy(translators, tmp_path_factory):
    """The trained translator saved with greedy search."""
    translator, _ = translators["trained"]
    directory = tmp_path_factory.mktemp("saved_greedy")
    kt.Translator(
        translator.model,
        translator.tokenizer,
        translator.generation_config,
        method="greedy",
    ).save(directory)
    return directory


def test_command_line_engine_translates_like_the_keras_engine(
    saved_greedy, tmp_path, capsys
):
    lines = [s for s in BATCH if "\n" not in s]
    source = tmp_path / "source.txt"
    source.write_text("".join(f"{line}\n" for line in lines), "utf-8")
    export = tmp_path / "export"
    status, out, err = _run(
        capsys,
        "export",
        "--model",
        saved_greedy,
        "--output",
        export,
        "--format",
        "ctranslate2",
    )
    assert status == 0, err
    assert out == f"{export}\n"
    outputs = {}
    for name, flags in {
        "keras": [],
        "export": ["--engine", "ctranslate2", "--model", export],
        "on_the_fly": ["--engine", "ctranslate2"],
    }.items():
        argv = ["translate", "--model", saved_greedy, "--input", source]
        status, out, err = _run(capsys, *argv, *flags, "--quiet")
        assert status == 0, err
        outputs[name] = out
    assert outputs["keras"].count("\n") == len(lines)
    assert len(set(outputs["keras"].splitlines())) >= 3
    assert outputs["export"] == outputs["keras"]
    assert outputs["on_the_fly"] == outputs["keras"]


def test_command_line_n_best_evaluate_and_score(saved_greedy, tmp_path, capsys):
    source = tmp_path / "source.txt"
    source.write_text("".join(f"{s}\n" for s in SENTENCES), "utf-8")
    reference = tmp_path / "reference.txt"
    reference.write_text(
        "".join(f"{' '.join(s.split()[::-1])}\n" for s in SENTENCES), "utf-8"
    )
    engine = ["--engine", "ctranslate2"]
    common = ["--model", saved_greedy]
    status, out, err = _run(
        capsys,
        "translate",
        *common,
        "--input",
        source,
        "--method",
        "beam",
        "--beam-size",
        "3",
        "--n-best",
        "2",
        "--quiet",
        *engine,
    )
    assert status == 0, err
    rows = [line.split(" ||| ") for line in out.splitlines()]
    assert [int(r[0]) for r in rows] == [i // 2 for i in range(12)]
    assert all(float(r[2]) <= 0 for r in rows)
    results = {}
    for name, flags in {"keras": [], "ctranslate2": engine}.items():
        status, out, err = _run(
            capsys,
            "evaluate",
            *common,
            "--source",
            source,
            "--reference",
            reference,
            "--quiet",
            *flags,
        )
        assert status == 0, err
        results[name, "bleu"] = out
        status, out, err = _run(
            capsys,
            "score",
            *common,
            "--source",
            source,
            "--target",
            reference,
            *flags,
        )
        assert status == 0, err
        results[name, "score"] = np.array(
            [[float(v) for v in line.split("\t")] for line in out.splitlines()]
        )
    assert results["ctranslate2", "bleu"] == results["keras", "bleu"]
    assert results["keras", "bleu"].startswith("BLEU = ")
    np.testing.assert_allclose(
        results["ctranslate2", "score"],
        results["keras", "score"],
        rtol=0,
        atol=SCORE_TOLERANCE,
    )


def test_bleu_benchmark_rows(translators, multi30k_dir, tmp_path):
    """`benchmarks.ctranslate2_bleu` on the trained translator saved as
    it is (beam 4, GNMT penalty): every row translates the split, and
    CTranslate2 in float32 gives exactly the Keras engine's translations
    with the search it runs ("hf", early stopping)."""
    from benchmarks import ctranslate2_bleu

    translator, _ = translators["trained"]
    translator.save(tmp_path / "saved")
    output = tmp_path / "bleu.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        report = ctranslate2_bleu.main(
            [
                "--model",
                str(tmp_path / "saved"),
                "--data-dir",
                str(multi30k_dir),
                "--limit",
                "12",
                "--threads",
                "0",
                "--output",
                str(output),
            ]
        )
    assert json.loads(output.read_text()) == json.loads(json.dumps(report))
    rows = {row["row"]: row for row in report["rows"]}
    assert list(rows) == [" ".join(row) for row in ctranslate2_bleu.ROWS]
    assert report["sentences"] == 12 and report["beam_size"] == 4
    assert all(0 <= row["bleu"] <= 100 for row in rows.values())
    assert rows["ctranslate2 float32 hf"]["same_as_keras_float32_hf"] == 12


def test_command_line_without_ctranslate2_names_the_extra(tmp_path):
    """A Python where ``import ctranslate2`` fails, as where it is not
    installed: each command refuses in one line, before any model
    loads (there is none at --model)."""
    blocker = tmp_path / "blocker" / "ctranslate2"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ctranslate2'\")\n"
    )
    environment = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(blocker.parent), os.environ.get("PYTHONPATH", "")]
        ),
    )
    missing = tmp_path / "no_model"
    for argv in (
        ["translate", "--engine", "ctranslate2"],
        ["evaluate", "--engine", "ctranslate2"],
        ["export", "--format", "ctranslate2", "--output", tmp_path / "out"],
    ):
        process = subprocess.run(
            [sys.executable, "-m", "keras_transformer.cli"]
            + [str(a) for a in argv]
            + ["--model", str(missing)],
            capture_output=True,
            text=True,
            env=environment,
            timeout=300,
        )
        assert process.returncode == 2, process.stderr
        last = process.stderr.strip().splitlines()[-1]
        assert last.startswith(f"keras-transformer {argv[0]}: error: ")
        assert "No module named 'ctranslate2'" in last
        assert 'pip install "keras-transformer[ctranslate2]"' in last
    assert not (tmp_path / "out").exists()
