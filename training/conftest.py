"""Fixtures of both test directories: tests/ (no PyTorch, run by scripts/test) and torch_tests/
(training and the TorchScript export, run by scripts/test-training)."""

import json

import pytest

from xfer_training.env import DEFAULT_XFER, REPO

#: The policies shipped in models/: the default, the presets and the light one.
SHIPPED = sorted(p.parent for p in (REPO / "models").glob("*/metadata.json"))


@pytest.fixture(scope="session")
def xfer():
    if not DEFAULT_XFER.exists():
        pytest.fail(f"{DEFAULT_XFER} is missing: run `cargo build --release` first")
    return DEFAULT_XFER


@pytest.fixture
def shipped():
    """The shipped policies' directories, by name."""
    return SHIPPED


@pytest.fixture(params=SHIPPED, ids=lambda m: m.name)
def model(request):
    """Each shipped policy's directory in turn."""
    return request.param


@pytest.fixture
def golden(model):
    """The model's golden vectors: (observation, logits, action) triples."""
    data = json.loads((model / "golden.json").read_text())
    return list(zip(data["inputs"], data["logits"], data["actions"], strict=True))
