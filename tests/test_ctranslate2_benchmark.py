"""`python -m benchmarks.ctranslate2 --smoke`: every contestant times and
translates, and on the same weights in float32 ours translates as
CTranslate2 does."""

import json

import keras
import pytest

pytest.importorskip("ctranslate2")
pytest.importorskip("transformers")

from benchmarks import ctranslate2 as benchmark  # noqa: E402
from tests.conftest import MULTI30K  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    path = tmp_path_factory.mktemp("ctranslate2") / "smoke.json"
    report = benchmark.main(
        [
            "--smoke",
            "--threads",
            "0",
            "--output",
            str(path),
            "--profile",
            "transformers",
        ]
    )
    return report, json.loads(path.read_text())


def test_smoke_times_every_contestant(smoke):
    report, written = smoke
    assert written == json.loads(json.dumps(report))
    assert written["backend"] == keras.backend.backend()
    assert written["rounds"] == 1
    rows = {row["contestant"]: row for row in written["rows"]}
    timed = {
        "ours_float32",
        "ctranslate2_float32",
        "ctranslate2_int8",
        "ours_ctranslate2_float32",
        "ours_ctranslate2_int8",
        "transformers",
    }
    assert timed <= set(rows)
    # Ours in int8 runs where the translator quantizes, else says why not.
    assert "ours_int8" in rows
    if "skipped" in rows["ours_int8"]:
        assert "quantize" in rows["ours_int8"]["skipped"]
    else:
        timed.add("ours_int8")
    for name in timed:
        row = rows[name]
        assert row["sentences_per_s"] > 0
        assert len(row["seconds_per_round"]) == 1
        translations = written["translations"][name]
        assert len(translations) == written["sentences"] == 8
        assert all(isinstance(t, str) for t in translations)
        assert any(translations)
    # Speeds relative to CTranslate2 float32: one round, so exactly the
    # ratio of the medians, up to the report's rounding to three decimals
    # (a contestant a hundred times slower has a ratio like 0.011).
    reference = rows["ctranslate2_float32"]
    assert reference["vs_ctranslate2_float32"] == 1.0
    for name in timed:
        expected = rows[name]["sentences_per_s"] / reference["sentences_per_s"]
        assert rows[name]["vs_ctranslate2_float32"] == pytest.approx(
            expected, rel=2e-2, abs=1e-3
        )


def test_ours_translates_as_ctranslate2_on_the_same_weights(smoke):
    """The same Marian weights, the same tokenization and beam search of
    4 in float32: equal translations for most sentences (a tie between
    hypotheses may fall either way in the last float32 bits), so the
    speeds compare the same work."""
    _, written = smoke
    rows = {row["contestant"]: row for row in written["rows"]}
    translations = written["translations"]
    reference = translations["ctranslate2_float32"]
    same = sum(
        a == b
        for a, b in zip(translations["ours_float32"], reference, strict=True)
    )
    assert rows["ours_float32"]["same_as_ctranslate2_float32"] == same
    assert same >= 6
    # The row counts what it names: CTranslate2 equals itself.
    assert rows["ctranslate2_float32"]["same_as_ctranslate2_float32"] == 8


def test_the_export_runs_on_the_same_engine(smoke):
    """The export's rows: speeds over CTranslate2's own conversion run by
    the same engine, in the same type, exactly the ratio of the one
    round's speeds up to the report's rounding; and the export translates
    as CTranslate2's conversion does."""
    _, written = smoke
    rows = {row["contestant"]: row for row in written["rows"]}
    for name, peer in benchmark.SAME_ENGINE.items():
        expected = rows[name]["sentences_per_s"] / rows[peer]["sentences_per_s"]
        assert rows[name]["vs_same_engine"] == pytest.approx(
            expected, rel=2e-2, abs=1e-3
        )
        assert "vs_same_engine" not in rows[peer]
    translations = written["translations"]
    same = sum(
        a == b
        for a, b in zip(
            translations["ours_ctranslate2_float32"],
            translations["ctranslate2_float32"],
            strict=True,
        )
    )
    assert same >= 6


def test_profile_lists_the_costliest_torch_operations(smoke):
    """``--profile transformers``: the torch operations of one more call,
    costliest first, with shares of the call that add up to at most 1."""
    _, written = smoke
    profile = written["profile"]
    assert profile["contestant"] == "transformers"
    operations = profile["operations"]
    assert 1 <= len(operations) <= benchmark.PROFILE_ROWS
    times = [op["self_cpu_ms"] for op in operations]
    assert times == sorted(times, reverse=True)
    assert 0 < sum(op["share"] for op in operations) <= 1.001
    assert any(op["operation"].startswith("aten::") for op in operations)


@pytest.mark.skipif(
    keras.backend.backend() == "torch",
    reason="ours runs torch operations on the torch backend",
)
def test_profiling_ours_off_torch_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as refused:
        benchmark.main(["--smoke", "--threads", "0", "--profile", "ours_int8"])
    message = str(refused.value)
    assert "\n" not in message
    assert "KERAS_BACKEND=torch" in message
    assert keras.backend.backend() in message
