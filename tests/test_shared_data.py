"""Tests that CI cannot skip: with ``KERAS_TRANSFORMER_REQUIRE_SHARED_DATA``
set (as ``.ci/run`` sets it), a test that skips for want of the shared
Multi30k copy fails instead; and ``.ci/run`` without that copy stops
before installing anything, naming the path it looked for."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, REQUIRE_DATA_VARIABLE

SKIPPING_TEST = """
import pytest

def test_needs_the_data():
    pytest.skip("Multi30k not found at /nowhere")

def test_skips_for_another_reason():
    pytest.skip("not on this backend")
"""


def _run(tmp_path, require):
    path = tmp_path / "test_skipping.py"
    path.write_text(SKIPPING_TEST)
    environment = dict(os.environ)
    environment.pop(REQUIRE_DATA_VARIABLE, None)
    if require:
        environment[REQUIRE_DATA_VARIABLE] = "1"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.conftest",
            "-rA",
            "-p",
            "no:cacheprovider",
            str(path),
        ],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
    )
    return result.returncode, result.stdout


def test_missing_data_skips_by_default(tmp_path):
    code, output = _run(tmp_path, require=False)
    assert code == 0, output
    assert "2 skipped" in output


def test_missing_data_fails_where_ci_requires_it(tmp_path):
    code, output = _run(tmp_path, require=True)
    assert code == 1, output
    assert "1 failed, 1 skipped" in output
    assert f"{REQUIRE_DATA_VARIABLE} is set" in output


# Stands in for python3 in the CI script's PATH: had the script gone on
# to make its virtual environment, the stub says so and stops it.
PYTHON_STUB = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/called"
exit 97
"""


@pytest.mark.parametrize("shared", ["absent", "without Multi30k"])
def test_ci_without_the_shared_data_stops_and_says_why(tmp_path, shared):
    repository = tmp_path / "repo"
    (repository / ".ci").mkdir(parents=True)
    shutil.copy(REPO_ROOT / ".ci" / "run", repository / ".ci" / "run")
    if shared == "without Multi30k":
        (tmp_path / "shared" / "data" / "multi30k").mkdir(parents=True)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "python3").write_text(PYTHON_STUB)
    (stubs / "python3").chmod(0o755)
    environment = dict(
        os.environ, PATH=f"{stubs}{os.pathsep}{os.environ['PATH']}"
    )
    result = subprocess.run(
        ["bash", str(repository / ".ci" / "run")],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        f"CI needs the shared Multi30k copy at {tmp_path}/shared/data/"
        "multi30k (train/valid/test): not found\n"
    )
    assert result.stdout == ""
    # Nothing was installed or made.
    assert not (stubs / "called").exists()
    assert sorted(os.listdir(repository)) == [".ci"]
