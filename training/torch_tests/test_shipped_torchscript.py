"""The policies in models/: PyTorch reproduces their golden vectors with the TorchScript export
(the one the optional `tch` runtime loads)."""

import numpy as np
import torch


def test_torchscript_export_reproduces_the_golden_vectors(model, golden):
    module = torch.jit.load(str(model / "policy.pt"))
    for x, logits, action in golden:
        with torch.no_grad():
            y = module(torch.tensor([x], dtype=torch.float32))[0].numpy()
        assert np.max(np.abs(y - np.asarray(logits))) < 1e-5
        assert int(np.argmax(y)) == action
