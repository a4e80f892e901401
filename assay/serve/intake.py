"""A request as the engine holds it, and its checks at intake: what add_request refuses with AssayError
before anything is queued.

A request with n > 1 choices is n EngineRequests: the first carries the others in `forks`; they wait as
one (they need n free slots at once), are prefilled once, and run apart from their first token on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from assay.core.errors import AssayError
from assay.serve.config import EngineConfig
from assay.serve.sampling import Sampling


@dataclass
class EngineRequest:
    request_id: str
    prompt: list[int]
    max_tokens: int
    sampling: Sampling
    stop_token_ids: frozenset[int]
    slot: int = -1
    forks: list[EngineRequest] = field(default_factory=list)  # the other choices of n, prefilled with this one
    prompt_logprobs: int | None = None  # echo: the prompt's log-probabilities, with this many alternatives
    next_position: int = 0  # where the next fed token goes (a KV cache's position; unused by a GLA state)
    last_token: int = -1
    generated: list[int] = field(default_factory=list)


def choice_ids(request_id: str, n: int) -> list[str]:
    """The engine ids of a request's n choices: choice 0 is the request itself, choice j > 0 is "<id>/<j>"."""
    return [request_id] + [f"{request_id}/{j}" for j in range(1, n)]


def new_request(
    config: EngineConfig, vocab_size: int, max_len: int | None, request_id: str, prompt_tokens: list[int], max_tokens: int, *,
    temperature: float = 0.0, seed: int | None = None, stop_token_ids: tuple[int, ...] = (), top_p: float = 1.0, top_k: int = 0,
    n: int = 1, logprobs: int | None = None, prompt_logprobs: int | None = None,
) -> EngineRequest:
    """The checked request (its other choices in .forks), or AssayError naming what is wrong."""
    prompt = [int(t) for t in prompt_tokens]
    if not prompt:
        raise AssayError("the prompt is empty: at least one token is needed")
    if len(prompt) > config.max_prompt_tokens:
        raise AssayError(f"the prompt has {len(prompt)} tokens; this server accepts at most {config.max_prompt_tokens}")
    if any(t < 0 or t >= vocab_size for t in prompt):
        raise AssayError(f"prompt token ids must be in [0, {vocab_size})")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= config.max_new_tokens:
        raise AssayError(f"max_tokens must be an integer in [1, {config.max_new_tokens}], got {max_tokens!r}")
    if max_len is not None and len(prompt) + max_tokens > max_len:
        raise AssayError(f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) exceeds the {max_len} positions of a KV-cache slot")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= config.max_seqs:
        raise AssayError(f"n must be an integer in [1, {config.max_seqs}] (the slots), got {n!r}")
    if prompt_logprobs is not None and (not isinstance(prompt_logprobs, int) or prompt_logprobs < 0):
        raise AssayError(f"prompt_logprobs must be an integer >= 0, got {prompt_logprobs!r}")
    sampling = Sampling.create(temperature, seed, top_p=top_p, top_k=top_k, logprobs=logprobs)
    stops = frozenset(int(t) for t in stop_token_ids)
    members = [
        EngineRequest(choice_id, prompt, max_tokens, sampling.fork(j) if j else sampling, stops, prompt_logprobs=prompt_logprobs)
        for j, choice_id in enumerate(choice_ids(request_id, n))
    ]
    members[0].forks = members[1:]
    return members[0]
