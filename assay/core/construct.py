"""Modules constructed under a default device; on "meta" without the random draws of their reset_parameters.

A meta tensor holds no values, so `nn.Embedding` / `nn.Linear` initialising one draws nothing, but torch routes
a meta tensor's normal_ / uniform_ through its Python references, and the first such call imports
torch._dynamo: about 1.3 CPU-seconds added to every process that only loads a checkpoint (`assay train`,
`assay serve --eager`, each rank of a sharded run). Transformers skips the same draws the same way
(`no_init_weights`). Values on any other device are untouched: a model built on "cpu" is initialised as before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

# torch.nn.init's in-place initialisers that module constructors call (nn.Linear, nn.Embedding, nn.Conv1d, ...).
INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                  "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")

_patching = threading.Lock()  # one meta construction at a time patches and restores torch.nn.init


def _skipped_on_meta(initialise):
    def initialise_unless_meta(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return tensor if tensor.is_meta else initialise(tensor, *args, **kwargs)

    return initialise_unless_meta


@contextlib.contextmanager
def default_device(device: torch.device | str) -> Iterator[None]:
    """`with torch.device(device)`; on "meta" torch.nn.init's initialisers also leave meta tensors alone."""
    device = torch.device(device)
    if device.type != "meta":
        with device:
            yield
        return
    with _patching, device:
        originals = {name: getattr(torch.nn.init, name) for name in INIT_FUNCTIONS}
        for name, initialise in originals.items():
            setattr(torch.nn.init, name, _skipped_on_meta(initialise))
        try:
            yield
        finally:
            for name, initialise in originals.items():
                setattr(torch.nn.init, name, initialise)
