"""The step-by-step reference (`gla_recurrent`), one decode step (`gla_step`), and the input checks.

Public shapes ([batch, time, heads, dim], as every attention-like op in assay):
  q, k, g: [B, T, H, K]   g: log forget gate per key channel, <= 0 (e.g. logsigmoid(x) / 16)
  v:       [B, T, H, V]
  state:   [B, H, K, V]
Recurrence:  S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t ;   o_t = (q_t * scale) S_t,  scale = K**-0.5.

The state is accumulated in float32 (float64 for float64 inputs) whatever the input dtype: it sums
the whole history, and a bfloat16 state would lose the small late contributions. Outputs come back
in q's dtype; the final state stays in the accumulation dtype so that decode continues from it
without a rounding step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from assay.core.errors import AssayError

MIN_CHUNK = 16
MAX_CHUNK = 128
CHUNK_MULTIPLE = 16


def accumulation_dtype(*dtypes: torch.dtype) -> torch.dtype:
    result = torch.float32
    for dtype in dtypes:
        result = torch.promote_types(result, dtype)
    return result


def check_inputs(q, k, v, g, initial_state) -> tuple[int, int, int, int, int]:
    if q.dim() != 4 or v.dim() != 4:
        raise AssayError(f"gla: q, k, g must be [B, T, H, K] and v [B, T, H, V]; got q {tuple(q.shape)}, v {tuple(v.shape)}")
    if k.shape != q.shape or g.shape != q.shape:
        raise AssayError(f"gla: q, k and g must have one shape; got q {tuple(q.shape)}, k {tuple(k.shape)}, g {tuple(g.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise AssayError(f"gla: v {tuple(v.shape)} must share batch, time and heads with q {tuple(q.shape)}")
    batch, time, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    if initial_state is not None and tuple(initial_state.shape) != (batch, heads, key_dim, value_dim):
        raise AssayError(
            f"gla: initial_state must be [B, H, K, V] = {(batch, heads, key_dim, value_dim)}; got {tuple(initial_state.shape)}"
        )
    return batch, time, heads, key_dim, value_dim


def check_chunk_size(chunk_size) -> None:
    if (
        isinstance(chunk_size, bool)
        or not isinstance(chunk_size, int)
        or not MIN_CHUNK <= chunk_size <= MAX_CHUNK
        or chunk_size % CHUNK_MULTIPLE
    ):
        raise AssayError(
            f"gla_chunk: chunk_size must be a multiple of {CHUNK_MULTIPLE} from {MIN_CHUNK} to {MAX_CHUNK} "
            f"(16, 32, 48, ..., 128); got {chunk_size!r}"
        )


@dataclass(frozen=True)
class StepLimits:
    decay_floor: float  # exp(g) below e^-this is exactly 0 (exp's argument is clamped first: no subnormal result)
    state_floor: float  # a state entry below e^-this in magnitude is exactly 0 after the step


# float32 (bfloat16 runs in float32): a kept decay >= e^-25 times a kept entry >= e^-60 is >= e^-85, above
# float32's smallest normal (e^-87.3), so the next step's decay S makes no subnormal either.
STEP_LIMITS = {torch.float32: StepLimits(25.0, 60.0), torch.float64: StepLimits(300.0, 350.0)}


def gla_step(q, k, v, g, state, scale=None):
    """One decode step: (o [B, H, V], new_state [B, H, K, V]) from q, k, g [B, H, K], v [B, H, V], state [B, H, K, V].

    No subnormal number is made (they run 5-50x slower on many CPUs, and a state that decays step after step
    would drift into their range): a decay below e^-25 is 0 and state entries below e^-60 are flushed to 0
    (float32; docs/gla.md states the error this adds)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out_dtype = q.dtype
    accum = accumulation_dtype(q.dtype, state.dtype)
    limits = STEP_LIMITS[accum]
    q, k, v, g = (x.to(accum) for x in (q, k, v, g))
    decay = F.threshold(g.clamp(min=-limits.decay_floor - 1.0).exp(), math.exp(-limits.decay_floor), 0.0)  # out of place: autograd
    new_state = torch.addcmul(k.unsqueeze(-1) * v.unsqueeze(-2), decay.unsqueeze(-1), state.to(accum))
    new_state = new_state.masked_fill(new_state.abs() < math.exp(-limits.state_floor), 0.0)
    o = ((q * scale).unsqueeze(-1) * new_state).sum(-2)  # [B, H, V]; a tiny bmm costs more than this on CPU
    return o.to(out_dtype), new_state


def gla_recurrent(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """The reference: `gla_step` once per token. Returns (o [B, T, H, V] in q's dtype, final_state or None)."""
    batch, _time, heads, key_dim, value_dim = check_inputs(q, k, v, g, initial_state)
    accum = accumulation_dtype(q.dtype)
    if initial_state is None:
        state = torch.zeros(batch, heads, key_dim, value_dim, dtype=accum, device=q.device)
    else:
        state = initial_state.to(accum)
    outputs = []
    # unbind: the backward of one unbind is one stack; indexing q[:, t] per step would be quadratic in T.
    for q_t, k_t, v_t, g_t in zip(q.unbind(1), k.unbind(1), v.unbind(1), g.unbind(1)):
        o_t, state = gla_step(q_t, k_t, v_t, g_t, state, scale)
        outputs.append(o_t)
    if outputs:
        o = torch.stack(outputs, dim=1)  # [B, T, H, V]
    else:
        o = q.new_zeros(batch, 0, heads, value_dim)
    return o.to(q.dtype), (state if output_final_state else None)
