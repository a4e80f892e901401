"""What an engine is built with (EngineConfig: each setting with its flag) and what it hands back (TokenEvent,
QueueFull)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from assay.core.errors import AssayError
from assay.serve.engine.scheduler import AUTO_BUCKETS, POLICIES, check_buckets, resolve_buckets
from assay.serve.runner.dtypes import QUANTIZATIONS, check_quantize, check_state_dtype, check_weight_dtype
from assay.serve.runner.gemm import DECODE_GEMMS, decode_gemm

if TYPE_CHECKING:
    from assay.serve.engine.sampling import TokenLogprob


def setting(default: Any, flag: str, help: str, **cli: Any) -> Any:  # noqa: A002 (Typer's own keyword)
    """A dataclass field with its command-line flag and help (and any other typer.Option keyword in `cli`,
    e.g. type=str for a value given as text): `assay serve`'s options are derived from these fields."""
    return field(default=default, metadata={"flag": flag, "help": help, **cli})


@dataclass(frozen=True)
class EngineConfig:
    """Every engine setting, declared once: `assay serve` derives its options from the fields with a flag, and
    its request (settings.ServeRequest) extends this class."""

    max_seqs: int = setting(64, "--max-seqs", "slots in the pool: sequences decoded together")
    # Resolved at construction to a tuple of widths, or None: --no-buckets (each new width compiled when first seen).
    buckets: tuple[int, ...] | str | None = setting(AUTO_BUCKETS, "--buckets", "decode widths, e.g. 1,2,4,8 (auto: powers of two up to --max-seqs)", type=str)
    eager: bool = setting(False, "--eager", "no torch.compile: exact, reproducible logits")
    device: str = setting("cpu", "--device", "cpu, cuda, neuron, xpu, mps, ...")
    backend: str = setting("inductor", "--backend", "torch.compile backend of the decode step")
    # serve/runner/gemm.py: inductor's C++ GEMM template reads a narrow step's weights at the memory's rate on an x86
    # CPU, the library GEMM at 30-45% of it; it costs max-autotune compiles at warm-up and a packed copy of the weights.
    decode_gemm: str = setting("auto", "--decode-gemm", f"the compiled decode's GEMM: {', '.join(DECODE_GEMMS)} (auto: inductor's C++ "
                                                        "template for widths up to 8 in float32, 16 in bfloat16, 4 with --quantize int8 on an x86 CPU, the library GEMM elsewhere)")
    # serve/runner/compiled_prefill.py: four graphs over dynamic rows and length, compiled at warm-up (SmolLM2 on 2
    # CPU cores: 240-270 s cold, beside 88 s for two decode widths); its calls take 0.72-0.84x the eager prefill's time.
    compile_prefill: bool = setting(False, "--compile-prefill", "also compile the prefill of a dense KV-cache model (4 graphs at warm-up, "
                                                                "any rows and length): faster prompts, minutes more warm-up on a CPU")
    state_dtype: str = setting("float32", "--state-dtype", "dtype of each slot's state: float32 or bfloat16")
    dtype: str = setting("float32", "--dtype", "dtype of the weights: float32 or bfloat16 (logits stay float32)")
    # serve/runner/quantize.py: int8 weights with one scale per output row, bfloat16 activations at each matmul.
    quantize: str | None = setting(None, "--quantize", f"weight-only quantization of the linear layers: {', '.join(QUANTIZATIONS)} "
                                                       "(int8 weights, one scale per output row; a quarter of float32's bytes per step)", type=str)
    max_waiting: int = setting(256, "--max-waiting", "requests queued for a slot before new ones get 429")
    max_prompt_tokens: int = setting(8192, "--max-prompt-tokens", "longest prompt accepted")
    max_new_tokens: int = setting(4096, "--max-new-tokens", "largest max_tokens accepted")
    # A KV-cache model's slot holds max_len positions. None: max_prompt_tokens + max_new_tokens, and from a
    # checkpoint (Engine.from_checkpoint) no more than the model's positions and what fits in memory.
    max_len: int | None = setting(None, "--max-len", "KV-cache models: positions per slot (default prompt + new tokens; past the "
                                                     "model's positions only where its rope scaling reaches)")
    # Also run the eager model on each compiled decode step's exact inputs and record the logit difference.
    check_eager: bool = False
    # Prompt tokens prefilled per step at most, padding included (rows x longest chunk; None: no limit). Each
    # step runs one batched prefill call, then the decode of every running sequence, so this bounds how long
    # a prefill stalls them; a prompt longer than it is chunked over steps (serve/engine/scheduler.py). 2048:
    # a 32 x 128-token wave on SmolLM2-135M (CPU, float32) keeps the throughput of no limit (92.7 vs 92.1
    # tokens/s; 512: 82.9), see docs/serve.md.
    max_prefill_tokens: int | None = setting(2048, "--max-prefill-tokens", "prompt tokens (padding included) prefilled per step at "
                                                                           "most; a longer prompt is prefilled in chunks between decode steps")
    # A prompt of more tokens is "long": short prompts are offered the prefill budget first and at most one long
    # prompt is prefilled at a time, taking what they leave (vLLM's long_prefill_token_threshold with
    # max_long_partial_prefills 1), so a 128-token request does not wait behind every chunk of a 2K one.
    # None or 0: first come, first served. 512: a quarter of the default budget.
    long_prefill_token_threshold: int | None = setting(
        512, "--long-prefill-token-threshold", "a prompt of more tokens is long: shorter prompts are prefilled first and one long "
                                               "prompt at a time takes the rest of the budget (0: first come, first served)")
    scheduling: str = setting("short-first", "--scheduling", f"the scheduling policy: {', '.join(POLICIES)}")

    def __post_init__(self):
        object.__setattr__(self, "buckets", resolve_buckets(self.buckets, self.max_seqs))

    @property
    def mode(self) -> str:
        return "eager" if self.eager else ("no-buckets" if self.buckets is None else "buckets")

    def slot_len(self) -> int:
        return self.max_len if self.max_len is not None else self.max_prompt_tokens + self.max_new_tokens

    def validate(self) -> None:
        if self.max_seqs < 1:
            raise AssayError(f"--max-seqs must be at least 1, got {self.max_seqs}")
        if self.max_waiting < 0:
            raise AssayError(f"--max-waiting must be >= 0, got {self.max_waiting}")
        if self.max_prompt_tokens < 1 or self.max_new_tokens < 1:
            raise AssayError("max_prompt_tokens and max_new_tokens must be positive")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 1:
            raise AssayError(f"--max-prefill-tokens must be at least 1, got {self.max_prefill_tokens}")
        if self.long_prefill_token_threshold is not None and self.long_prefill_token_threshold < 0:
            raise AssayError(f"--long-prefill-token-threshold must be >= 0 (0: off), got {self.long_prefill_token_threshold}")
        if self.max_len is not None and self.max_len < 2:
            raise AssayError(f"--max-len must be at least 2, got {self.max_len}")
        check_state_dtype(self.state_dtype)
        check_weight_dtype(self.dtype)
        check_quantize(self.quantize)
        check_buckets(self.buckets, self.max_seqs)
        decode_gemm(self.decode_gemm, self.device.split(":")[0], None if self.eager else self.backend, 1)
        if self.compile_prefill and self.eager:
            raise AssayError("--compile-prefill needs a compiled engine: drop --eager")
        if self.scheduling not in POLICIES:
            raise AssayError(f"scheduling {self.scheduling!r}: expected one of {', '.join(sorted(POLICIES))}")


class QueueFull(AssayError):
    """add_request when the waiting queue already holds max_waiting requests (HTTP: 429, retry later)."""


@dataclass
class TokenEvent:
    request_id: str
    token_id: int  # -1 for an abort
    index: int  # 0-based output position
    finished: bool
    finish_reason: str | None  # "length" | "stop" | "abort" when finished
    # With logprobs: the token's log-probability and the top alternatives (sampling.TokenLogprob).
    logprob: TokenLogprob | None = None
    # With prompt_logprobs, on a request's first event: one entry per prompt token (the first has no value).
    prompt_logprobs: list[TokenLogprob] | None = None


__all__ = ["EngineConfig", "QueueFull", "TokenEvent"]
