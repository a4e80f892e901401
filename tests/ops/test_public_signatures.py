"""assay.ops is the public face of the GLA operators: the signatures outside code calls stay as documented."""

from __future__ import annotations

import inspect

import torch

import assay.ops
from assay.kernels.gla.reference import gla_recurrent as reference_recurrent


def _parameters(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_public_gla_functions_keep_their_documented_signatures():
    empty = inspect.Parameter.empty
    qkvg = [("q", empty), ("k", empty), ("v", empty), ("g", empty)]
    assert _parameters(assay.ops.gla_chunk) == [
        *qkvg, ("scale", None), ("initial_state", None), ("output_final_state", False), ("chunk_size", 64)]
    assert _parameters(assay.ops.gla_recurrent) == [*qkvg, ("scale", None), ("initial_state", None), ("output_final_state", False)]
    assert _parameters(assay.ops.gla_step) == [*qkvg, ("state", empty), ("scale", None)]


def test_the_public_functions_pass_every_argument_through():
    # Non-default scale, initial state and final state: a dropped or reordered argument changes the result.
    generator = torch.Generator().manual_seed(0)
    q, k, g = (torch.randn(1, 5, 2, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    g = torch.nn.functional.logsigmoid(g)
    v = torch.randn(1, 5, 2, 3, generator=generator, dtype=torch.float64)
    state = torch.randn(1, 2, 4, 3, generator=generator, dtype=torch.float64)
    expected_o, expected_state = reference_recurrent(q, k, v, g, 0.3, state, True)
    o, final = assay.ops.gla_recurrent(q, k, v, g, scale=0.3, initial_state=state, output_final_state=True)
    assert torch.equal(o, expected_o) and torch.equal(final, expected_state)
    # float64 throughout: the chunked form agrees with the reference to well below 1e-10 relative error.
    o, final = assay.ops.gla_chunk(q, k, v, g, scale=0.3, initial_state=state, output_final_state=True, chunk_size=16)
    assert torch.linalg.norm(o - expected_o) <= 1e-10 * torch.linalg.norm(expected_o)
    assert torch.linalg.norm(final - expected_state) <= 1e-10 * torch.linalg.norm(expected_state)
    o_t, new_state = assay.ops.gla_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], state, scale=0.3)
    o_ref, _ = reference_recurrent(q[:, :1], k[:, :1], v[:, :1], g[:, :1], 0.3, state, True)
    assert torch.equal(o_t, o_ref[:, 0])
    assert new_state.shape == state.shape
