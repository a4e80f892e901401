"""What an engine is built with (EngineConfig) and what it hands back (TokenEvent, QueueFull)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from assay.core.errors import AssayError
from assay.serve.engine.scheduler import DEFAULT_BUCKETS, check_buckets
from assay.serve.runner.dtypes import check_state_dtype, check_weight_dtype

if TYPE_CHECKING:
    from assay.serve.engine.sampling import TokenLogprob


@dataclass(frozen=True)
class EngineConfig:
    max_seqs: int = 64  # slots in the pool
    buckets: tuple[int, ...] | None = DEFAULT_BUCKETS  # None: --no-buckets (each new width compiled when first seen)
    eager: bool = False
    device: str = "cpu"
    backend: str = "inductor"
    state_dtype: str = "float32"  # or "bfloat16"
    dtype: str = "float32"  # the weights' (--dtype): float32 or bfloat16; logits are float32 either way
    max_waiting: int = 256  # bounded queue of requests not yet in a slot
    max_prompt_tokens: int = 8192
    max_new_tokens: int = 4096  # upper limit for a request's max_tokens
    # A KV-cache model's slot holds max_len positions. None: max_prompt_tokens + max_new_tokens, and from a
    # checkpoint (Engine.from_checkpoint) no more than the model's positions and what fits in memory.
    max_len: int | None = None
    # Also run the eager model on each compiled decode step's exact inputs and record the logit difference.
    check_eager: bool = False
    # Prompt tokens prefilled per step at most, padding included (rows x longest chunk; None: no limit). Each
    # step runs one batched prefill call, then the decode of every running sequence, so this bounds how long
    # a prefill stalls them; a prompt longer than it is chunked over steps (serve/engine_prefill.py). 2048:
    # a 32 x 128-token wave on SmolLM2-135M (CPU, float32) keeps the throughput of no limit (92.7 vs 92.1
    # tokens/s; 512: 82.9), see docs/serve.md.
    max_prefill_tokens: int | None = 2048
    # A prompt of more tokens is "long": short prompts are offered the prefill budget first and at most one long
    # prompt is prefilled at a time, taking what they leave (vLLM's long_prefill_token_threshold with
    # max_long_partial_prefills 1), so a 128-token request does not wait behind every chunk of a 2K one.
    # None or 0: first come, first served. 512: a quarter of the default budget.
    long_prefill_token_threshold: int | None = 512

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
        check_buckets(self.buckets, self.max_seqs)


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
