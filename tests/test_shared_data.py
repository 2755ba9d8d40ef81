"""Tests that CI cannot skip: with ``KERAS_TRANSFORMER_REQUIRE_SHARED_DATA``
set (as ``.ci/run`` sets it), a test that skips for want of the shared
Multi30k copy fails instead."""

import os
import subprocess
import sys

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
