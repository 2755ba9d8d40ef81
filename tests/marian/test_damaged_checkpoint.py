"""A damaged Marian checkpoint names its file."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from keras_transformer import marian


@pytest.mark.parametrize("cut", ["empty", "inside_the_header", "half"])
def test_truncated_safetensors_is_named(tmp_path, cut):
    path = tmp_path / marian.SAFETENSORS_FILE
    save_file({"w": np.arange(64, dtype="float32").reshape(8, 8)}, path)
    assert marian.read_state_dict(tmp_path)["w"][7, 7] == 63
    data = path.read_bytes()
    keep = {"empty": 0, "inside_the_header": 7, "half": len(data) // 2}
    path.write_bytes(data[: keep[cut]])
    with pytest.raises(ValueError) as error:
        marian.read_state_dict(tmp_path)
    message = str(error.value)
    assert message.startswith(f"{path} cannot be read as a checkpoint (")
    assert message.endswith("download it again.")
    assert "\n" not in message


def test_truncated_pytorch_checkpoint_is_named(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / marian.PYTORCH_FILE
    torch.save({"w": torch.arange(64.0)}, path)
    np.testing.assert_array_equal(
        marian.read_state_dict(tmp_path)["w"], np.arange(64.0)
    )
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=f"^{path} cannot be read as a"):
        marian.read_state_dict(tmp_path)
