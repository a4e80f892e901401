"""default_device: modules built on "meta" skip their initialisers' draws (and the dynamo import those draws
cost); on any other device they are initialised exactly as under `with torch.device(...)`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from assay.core.construct import INIT_FUNCTIONS, default_device


def test_a_meta_build_keeps_dynamo_unimported_in_a_fresh_process():
    code = """
import sys, torch
from torch import nn
from assay.core.construct import default_device
with default_device("meta"):
    model = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 32), nn.LayerNorm(32))
assert all(p.is_meta for p in model.parameters())
print("torch._dynamo" in sys.modules)
"""
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip() == "False"


def test_a_cpu_build_is_initialised_as_plain_torch_device_does():
    torch.manual_seed(0)
    with torch.device("cpu"):
        plain = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 32))
    torch.manual_seed(0)
    with default_device("cpu"):
        ours = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 32))
    for a, b in zip(plain.parameters(), ours.parameters()):
        assert torch.equal(a, b)  # the same draws in the same order: equal bit for bit


def test_the_initialisers_are_restored_after_a_meta_build_even_when_it_fails():
    originals = {name: getattr(nn.init, name) for name in INIT_FUNCTIONS}
    with pytest.raises(RuntimeError, match="a constructor failed"), default_device("meta"):
        assert nn.init.normal_ is not originals["normal_"]  # patched inside
        nn.Linear(4, 4)
        raise RuntimeError("a constructor failed")
    assert {name: getattr(nn.init, name) for name in INIT_FUNCTIONS} == originals
    # A real tensor met inside a meta build (a buffer made on the CPU) is still initialised.
    with default_device("meta"):
        real = nn.init.ones_(torch.empty(3, device="cpu"))
    assert torch.equal(real, torch.ones(3))
