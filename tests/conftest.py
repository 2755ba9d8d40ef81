"""Test configuration: environment first, then Keras.

`huggingface_hub` reads its settings once, at import, and `import keras`
imports it, so they are set here before any test module imports Keras.
The backend comes from ``KERAS_BACKEND`` (CI runs the suite once per
backend); it defaults to JAX, the fastest on this CPU.
"""

import atexit
import os
import pathlib
import shutil
import socket
import tempfile

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault(
    "HF_HOME", os.path.join(tempfile.gettempdir(), "keras-transformer-hf")
)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The Hub tests' local server (tests/hub/hub_server.py) listens on this
# port; the endpoint must be known before huggingface_hub is imported.
os.environ["KERAS_TRANSFORMER_TEST_HUB_PORT"] = str(_free_port())
os.environ["HF_ENDPOINT"] = (
    f"http://127.0.0.1:{os.environ['KERAS_TRANSFORMER_TEST_HUB_PORT']}"
)
os.environ.pop("HF_TOKEN", None)

# On JAX, many tests, and the command-line processes they start, compile
# the same small models: a compilation cache for the session (inherited
# by those processes) compiles each once. A run with its own cache
# directory keeps it.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _jax_cache = tempfile.mkdtemp(prefix="keras-transformer-jax-cache-")
    atexit.register(shutil.rmtree, _jax_cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _jax_cache
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts with the float32 policy and fixed seeds."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


# CI sets this: there, a test that would skip for want of the shared
# Multi30k copy fails instead, so that a machine without ``../shared``
# cannot turn a run green by skipping.
REQUIRE_DATA_VARIABLE = "KERAS_TRANSFORMER_REQUIRE_SHARED_DATA"
MISSING_DATA_REASON = "Multi30k not found at"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or not os.environ.get(REQUIRE_DATA_VARIABLE):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
    if MISSING_DATA_REASON in str(reason):
        report.outcome = "failed"
        report.longrepr = (
            f"{reason}; {REQUIRE_DATA_VARIABLE} is set, so a test may not "
            "skip for want of the shared data: put Multi30k EN-DE at "
            f"{MULTI30K} (see ../shared/data/multi30k/README)."
        )


@pytest.fixture
def multi30k_dir():
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    return MULTI30K


@pytest.fixture
def rng():
    return np.random.default_rng(0)
