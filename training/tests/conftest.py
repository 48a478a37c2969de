import pytest

from xfer_training.env import DEFAULT_XFER


@pytest.fixture(scope="session")
def xfer():
    if not DEFAULT_XFER.exists():
        pytest.fail(f"{DEFAULT_XFER} is missing: run `cargo build --release` first")
    return DEFAULT_XFER
