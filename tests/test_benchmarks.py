"""Each benchmark's smallest setting runs, so the benchmarks never go
stale, and the numbers they are built on are right."""

import json

import keras
import numpy as np
import pytest

from benchmarks import decoding, end_to_end, gpu, optimizer, training
from benchmarks.training import model_config, train_flops


def test_train_flops_of_the_base_model_by_hand():
    # Base (d 512, d_ff 2048, 6 + 6 layers), batch 1, source 10, target 20,
    # vocabulary 100; forward matmuls times 3 for the backward pass.
    d, f = 512, 2048
    encoder = 6 * (2 * 10 * (4 * d * d + 2 * d * f) + 4 * 10 * 10 * d)
    decoder = 6 * (
        2 * 20 * (6 * d * d + 2 * d * f)  # self q k v o, cross q o, ffn
        + 2 * 10 * 2 * d * d  # cross-attention keys and values
        + 4 * 20 * 20 * d
        + 4 * 20 * 10 * d
    )
    output = 2 * 20 * d * 100
    assert train_flops(model_config("base"), 1, 10, 20, 100) == 3 * (
        encoder + decoder + output
    )


def test_training_smoke(tmp_path):
    path = tmp_path / "training.json"
    report = training.main(["--smoke", "--threads", "0", "--output", str(path)])
    assert json.loads(path.read_text())["benchmark"] == "training"
    rows = {r["contestant"]: r for r in report["configs"]["smoke"]["rows"]}
    expected = {"ours", "keras_hub", "keras_hub_keras_loss"}
    if keras.backend.backend() == "torch":
        expected |= {"torch", "ours_keras_adam"}
    if keras.backend.backend() == "tensorflow":
        # Our Adam runs other code than Keras's on TensorFlow's graph
        # executor (not under XLA, see the test below).
        expected |= {"ours_keras_adam"}
    assert set(rows) == expected
    assert rows["ours"]["optimizer"] == "keras_transformer"
    assert rows["keras_hub"]["optimizer"] == "keras"
    # The peers are the same size: equal parameter counts, except
    # torch.nn.Transformer's two extra final LayerNorms.
    assert rows["keras_hub"]["parameters"] == rows["ours"]["parameters"]
    assert (
        rows["keras_hub_keras_loss"]["parameters"] == rows["ours"]["parameters"]
    )
    if "torch" in rows:
        assert rows["torch"]["parameters"] == rows["ours"]["parameters"] + 64
    for row in rows.values():
        assert row["tokens_per_s"] > 0
        assert 0 < row["probe_fraction"] < 10
    assert rows["keras_hub"]["ours_speedup"]["median"] > 0
    # Keras's own jit_compile="auto", recorded per contestant.
    auto = keras.backend.backend() == "jax"
    assert rows["ours"]["jit_compile"] is rows["keras_hub"]["jit_compile"]
    assert rows["ours"]["jit_compile"] is auto


@pytest.mark.skipif(
    keras.backend.backend() == "torch",
    reason="jit_compile=True is torch.compile on torch",
)
def test_training_under_xla_has_no_keras_adam_contestant():
    # Under XLA our Adam runs Keras's code: a contestant would be a copy.
    report = training.main(
        ["--smoke", "--threads", "0", "--skip-keras-hub", "--jit-compile"]
        + ["true"]
    )
    rows = report["configs"]["smoke"]["rows"]
    assert [r["contestant"] for r in rows] == ["ours"]
    assert rows[0]["jit_compile"] is True


def test_optimizer_smoke(tmp_path):
    path = tmp_path / "optimizer.json"
    report = optimizer.main(
        ["--smoke", "--threads", "0", "--output", str(path)]
    )
    assert json.loads(path.read_text())["benchmark"] == "optimizer"
    result = report["configs"]["smoke"]
    expected = ["ours", "keras"]
    if keras.backend.backend() == "torch":
        expected += ["torch", "torch_fused"]
    assert [r["contestant"] for r in result["rows"]] == expected
    rows = {r["contestant"]: r for r in result["rows"]}
    for row in rows.values():
        assert row["ms"] > 0 and len(row["per_round_ms"]) == 1
    assert rows["keras"]["ours_speedup"]["median"] == pytest.approx(
        rows["keras"]["per_round_ms"][0] / rows["ours"]["per_round_ms"][0]
    )
    # Every trainable variable of the one-layer model is updated.
    assert result["parameters"] == sum(
        int(np.prod(v.shape))
        for v in training.build_ours(
            model_config("smoke"), 64
        ).trainable_variables
    )


def test_training_dropout_replaces_the_configurations(tmp_path):
    default = training.main(
        ["--smoke", "--threads", "0", "--skip-keras-hub", "--skip-torch"]
    )
    assert default["configs"]["smoke"]["dropout"] == 0.1
    report = training.main(
        ["--smoke", "--threads", "0", "--skip-keras-hub", "--skip-torch"]
        + ["--dropout", "0"]
    )
    assert report["configs"]["smoke"]["dropout"] == 0.0


def test_decoding_smoke(tmp_path):
    output = tmp_path / "d.json"
    report = decoding.main(
        ["--smoke", "--threads", "0", "--output", str(output)]
        + ["--compare-cache-layouts"]
    )
    rows = report["cached_vs_uncached"]
    assert [(r["batch_size"], r["method"]) for r in rows] == [
        (1, "greedy"),
        (1, "beam4"),
    ]
    layouts = {"split", "stacked"}
    for row in rows:
        assert row["steps"] == 4
        assert row["cached_s"] > 0 and row["uncached_s"] > 0
        assert row["speedup"] == pytest.approx(
            row["uncached_s"] / row["cached_s"]
        )
        assert {row["cache_layout"], row["other_layout"]} == layouts
        assert row["layout_speedup"]["per_round"] == [
            pytest.approx(row["other_layout_s"] / row["cached_s"])
        ]
    assert (
        json.loads(output.read_text())["cached_vs_uncached"][0]["other_layout"]
        == rows[0]["other_layout"]
    )


def test_end_to_end_smoke(tmp_path):
    report = end_to_end.main(
        ["--smoke", "--threads", "0", "--output", str(tmp_path / "e.json")]
    )
    buckets = report["contestants"]["buckets"]
    fixed = report["contestants"]["fixed"]
    # Same pairs per epoch, so the same real tokens; fixed-length padding
    # pads more and has one shape.
    assert buckets["epoch_real_tokens"] == fixed["epoch_real_tokens"] > 0
    assert fixed["distinct_shapes"] == 1
    assert buckets["timed_padding_fraction"] < fixed["timed_padding_fraction"]
    assert buckets["real_tokens_per_s"] > 0


def test_gpu_script_smoke_on_cpu(tmp_path):
    report = gpu.main(["--smoke", "--output", str(tmp_path / "g.json")])
    assert report["steps_timed"] == 2
    assert report["tokens_per_s"] > 0
    assert report["dtype"] == "mixed_bfloat16"
    assert gpu.peak_for("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu.peak_for("NVIDIA A100-SXM4-40GB") == 312.0
    assert gpu.peak_for("cpu") is None
    assert gpu.peak_for("cpu", 12.5) == 12.5
    # The table's peaks are bfloat16's: other dtypes need --peak-tflops.
    assert gpu.peak_for("NVIDIA H200", compute_dtype="float32") is None
    assert gpu.peak_for("NVIDIA H200", 60.0, "float32") == 60.0
    # The probe runs on the same device, in the compute dtype.
    assert report["probe_tflops"] > 0
    assert report["probe_fraction"] == pytest.approx(
        report["achieved_tflops"] / report["probe_tflops"]
    )
    with open(tmp_path / "g.json") as f:
        assert json.load(f)["probe_tflops"] == report["probe_tflops"]


def test_gpu_script_probe_can_be_skipped():
    report = gpu.main(["--smoke", "--dtype", "float32", "--probe-size", "0"])
    assert report["probe_tflops"] is None
    assert report["probe_fraction"] is None
    assert report["peak_fraction"] is None


def test_matmul_probe_smoke():
    from benchmarks import probe

    report = probe.main(["--smoke", "--threads", "0"])
    assert report["float32_gflops"] > 0
    assert report["bfloat16_gflops"] > 0
    assert report["bfloat16_speedup"] == pytest.approx(
        report["bfloat16_gflops"] / report["float32_gflops"]
    )


def test_training_smoke_against_mixed_bfloat16(tmp_path):
    report = training.main(
        [
            "--smoke",
            "--threads",
            "0",
            "--with-mixed-bfloat16",
            "--skip-keras-hub",
            "--skip-torch",
        ]
    )
    rows = {r["contestant"]: r for r in report["configs"]["smoke"]["rows"]}
    assert set(rows) - {"ours_keras_adam"} == {"ours", "ours_mixed_bfloat16"}
    assert rows["ours"]["dtype_policy"] == "float32"
    bfloat16 = rows["ours_mixed_bfloat16"]
    assert bfloat16["dtype_policy"] == "mixed_bfloat16"
    assert bfloat16["parameters"] == rows["ours"]["parameters"]
    # The speed-up of the policy is the inverse of ours against it.
    assert bfloat16["speedup_over_float32"]["median"] == pytest.approx(
        1 / bfloat16["ours_speedup"]["median"]
    )


def test_mixed_bfloat16_contestant_needs_float32(capsys):
    with pytest.raises(SystemExit):
        training.parse_args(
            ["--with-mixed-bfloat16", "--dtype", "mixed_bfloat16"]
        )
    assert "--with-mixed-bfloat16 compares against float32" in (
        capsys.readouterr().err
    )


def test_fast_paths_smoke(tmp_path):
    """Every fast path serving this backend is timed on and off."""
    from benchmarks import fast_paths
    from keras_transformer import backends

    path = tmp_path / "f.json"
    report = fast_paths.main(
        ["--smoke", "--rounds", "1", "--sentences", "4", "--output", str(path)]
    )
    backend = keras.backend.backend()
    serving = {
        name
        for name, fast_path in backends.FAST_PATHS.items()
        if fast_path.runs_here()
    }
    assert {row["fast_path"] for row in report["rows"]} == serving
    for row in report["rows"]:
        assert row["on_s"] > 0 and row["off_s"] > 0
        # The times are rounded to 0.1 ms and the gain to 0.001: the gain
        # lies between the ratios that rounding allows.
        on, off, half = row["on_s"], row["off_s"], 0.00005
        low, high = (off - half) / (on + half), (off + half) / (on - half)
        assert low - 0.0005 <= row["gain"] <= high + 0.0005, row
    assert json.loads(path.read_text())["backend"] == backend


def test_before_after_smoke_times_both_versions():
    from benchmarks import before_after

    report = before_after.main(["--smoke", "--ref", "HEAD"])
    assert report["config"] == "smoke"
    assert len(report["ratios_per_round"]) == 1
    assert report["before_step_s"] > 0 and report["after_step_s"] > 0
    assert report["after_over_before"] == pytest.approx(
        report["after_step_s"] / report["before_step_s"]
    )


def test_cli_startup_smoke(tmp_path):
    from benchmarks import cli_startup

    path = tmp_path / "startup.json"
    report = cli_startup.main(["--runs", "1", "--output", str(path)])
    assert json.loads(path.read_text()) == report
    # The command's help and version import no framework; the parser's
    # old import of the recipes did.
    assert report["frameworks_imported"] == {
        "help": [],
        "translate_help": [],
        "version": [],
    }
    medians = report["median_seconds"]
    assert set(medians) >= {"help", "version", "before_import_recipes"}
    assert all(value > 0 for value in medians.values())
    assert "cpu_count" in report["machine"]
    assert len(report["load_average_1_5_15_min"]) == 3
