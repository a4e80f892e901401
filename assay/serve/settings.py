"""What `assay serve` is asked for (ServeRequest: the checkpoint, the engine's settings, the server's), and
the engine configuration it resolves to, checked before torch is imported."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from assay.core.errors import AssayError
from assay.serve.http.middleware import DEFAULT_MAX_REQUEST_BYTES


@dataclass(frozen=True)
class ServeRequest:
    model: str
    device: str = "cpu"
    backend: str = "inductor"
    max_seqs: int = 64
    buckets: Optional[str] = None  # "1,2,4,8"; None: powers of two up to max_seqs
    no_buckets: bool = False
    eager: bool = False
    state_dtype: str = "float32"
    dtype: str = "float32"  # the weights' (--dtype): float32 or bfloat16; logits are float32 either way
    max_prefill_tokens: int | None = None  # None: the engine's default budget
    long_prefill_token_threshold: int | None = None  # None: the engine's default
    max_waiting: int = 256
    max_prompt_tokens: int = 8192
    max_new_tokens: int = 4096
    max_len: Optional[int] = None
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: Optional[str] = None
    # Every /v1/* route needs `Authorization: Bearer <api_key>` (None: open). Kept out of repr, so out of logs.
    api_key: Optional[str] = field(default=None, repr=False)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # a larger body is 413 before it is parsed


def default_buckets(max_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the first power of two >= max_seqs: every running count has a bucket."""
    widths = [1]
    while widths[-1] < max_seqs:
        widths.append(widths[-1] * 2)
    return tuple(widths)


def engine_config(request: ServeRequest):
    """The engine's flags, checked (with --dtype, and --max-len against the checkpoint's positions)."""
    from assay.serve.engine.config import EngineConfig
    from assay.serve.engine.scheduler import parse_buckets

    if request.no_buckets and request.buckets is not None:
        raise AssayError("--buckets and --no-buckets exclude each other")
    if request.no_buckets:
        buckets = None
    elif request.buckets is not None:
        buckets = parse_buckets(request.buckets)
    else:
        buckets = default_buckets(request.max_seqs)
    config = EngineConfig(
        max_seqs=request.max_seqs, buckets=buckets, eager=request.eager, device=request.device, backend=request.backend,
        state_dtype=request.state_dtype, max_waiting=request.max_waiting, max_prompt_tokens=request.max_prompt_tokens,
        max_new_tokens=request.max_new_tokens, max_len=request.max_len, dtype=request.dtype,
        **({} if request.max_prefill_tokens is None else {"max_prefill_tokens": request.max_prefill_tokens}),
        **({} if request.long_prefill_token_threshold is None else {"long_prefill_token_threshold": request.long_prefill_token_threshold}),
    )
    config.validate()
    if request.max_len is not None:  # sizing imports torch: only when there is a --max-len to check
        from assay.serve.runner.sizing import check_max_len

        check_max_len(request.model, request.max_len)
    return config


def check_request(request: ServeRequest) -> None:
    """The HTTP flags (engine_config checks the engine's)."""
    if not 0 <= request.port <= 65535:
        raise AssayError(f"--port must be in [0, 65535], got {request.port}")
    if request.max_request_bytes < 1024:
        raise AssayError(f"--max-request-bytes must be at least 1024, got {request.max_request_bytes}")
    if request.api_key is not None and (not request.api_key.strip() or any(c.isspace() for c in request.api_key)):
        raise AssayError("--api-key (or ASSAY_API_KEY) must be a non-empty string without spaces")
