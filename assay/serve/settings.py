"""What `assay serve` is asked for (ServeRequest: the checkpoint, the engine's settings, the server's), and
the engine configuration it resolves to, checked before torch is imported."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from assay.core.errors import AssayError
from assay.models import builtin_arch_names
from assay.serve.engine.config import EngineConfig, setting
from assay.serve.engine.scheduler import AUTO_BUCKETS
from assay.serve.http.middleware import DEFAULT_MAX_REQUEST_BYTES


@dataclass(frozen=True, kw_only=True)
class ServeRequest(EngineConfig):
    """The checkpoint, the engine's settings (EngineConfig's fields, each declared there once) and the server's.
    `assay serve` derives its options from the fields with a flag (commands.py)."""

    model: str = field(metadata={"flag": "--model", "help": f"checkpoint folder of a registered architecture "
                                                            f"({', '.join(builtin_arch_names())}; config.json, weights, tokenizer)"})
    no_buckets: bool = setting(False, "--no-buckets", "decode at the exact running count (each new count compiles)")
    # On a CPU, compiling every bucket width with inductor takes minutes (5 for SmolLM2's 7 widths on 2 cores)
    # before the first request: a plain `assay serve` there decodes eager and is ready in seconds.
    compile: bool = setting(False, "--compile", "compile the decode step at every bucket width before serving: the default on an "
                                                "accelerator; on a CPU the default is eager (ready in seconds) unless --backend, "
                                                "--buckets, --no-buckets, --decode-gemm or --compile-prefill is given")
    host: str = setting("127.0.0.1", "--host", "address to listen on (0.0.0.0 for every interface)")
    port: int = setting(8000, "--port", "port to listen on (0: a free port, printed)")
    served_model_name: Optional[str] = setting(None, "--served-model-name", "the name clients pass as model (default: the folder name)")
    # Every /v1/* route needs `Authorization: Bearer <api_key>` (None: open). Kept out of repr, so out of logs.
    api_key: Optional[str] = field(default=None, repr=False, metadata={
        "flag": "--api-key", "envvar": "ASSAY_API_KEY", "show_default": False, "show_envvar": True,
        "help": "every /v1/* route needs 'Authorization: Bearer KEY' (/health and /metrics stay open); prefer the environment "
                "variable ASSAY_API_KEY (not in the process list)"})
    max_request_bytes: int = setting(DEFAULT_MAX_REQUEST_BYTES, "--max-request-bytes", "a larger request body is refused (413) before it is parsed")

    def __post_init__(self):
        if self.no_buckets and self.buckets not in (None, AUTO_BUCKETS):
            raise AssayError("--buckets and --no-buckets exclude each other")
        if self.eager and self.compile:
            raise AssayError("--eager and --compile exclude each other")
        if not self.eager and not self.compile and self.device.split(":")[0] == "cpu" and not self.names_compiling():
            object.__setattr__(self, "eager", True)
        if self.no_buckets:
            object.__setattr__(self, "buckets", None)
        super().__post_init__()


    def names_compiling(self) -> bool:
        """Whether a setting only a compiled engine reads was given (--backend, --buckets, --no-buckets, --decode-gemm,
        --compile-prefill)."""
        return (self.backend != _DEFAULT_BACKEND or self.buckets != AUTO_BUCKETS or self.no_buckets or self.decode_gemm != _DEFAULT_GEMM
                or self.compile_prefill)


_DEFAULT_BACKEND = EngineConfig.__dataclass_fields__["backend"].default
_DEFAULT_GEMM = EngineConfig.__dataclass_fields__["decode_gemm"].default


def engine_config(request: ServeRequest) -> EngineConfig:
    """The engine's settings, checked (with --dtype, and --max-len against the checkpoint's positions)."""
    config = EngineConfig(**{f.name: getattr(request, f.name) for f in fields(EngineConfig)})
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
