"""A request as the engine holds it (and as its prefill job while its prompt is being prefilled), and its
checks at intake: what add_request refuses with AssayError before anything is queued.

A request with n > 1 choices is n EngineRequests: the first carries the others in `forks`; they wait as
one (they need n free slots at once), are prefilled once, and run apart from their first token on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from assay.core.errors import AssayError
from assay.serve.engine.config import EngineConfig
from assay.serve.engine.penalties import TokenHistory
from assay.serve.engine.sampling import Sampling, SamplingParams, TokenLogprob


@dataclass
class EngineRequest:
    request_id: str
    prompt: list[int]
    sampling: Sampling  # the request's SamplingParams (.params) and this choice's random stream
    stop_token_ids: frozenset[int]
    slot: int = -1
    forks: list[EngineRequest] = field(default_factory=list)  # the other choices of n, prefilled with this one
    next_position: int = 0  # where the next fed token goes (a KV cache's position; unused by a GLA state)
    last_token: int = -1
    generated: list[int] = field(default_factory=list)

    @property
    def max_tokens(self) -> int:
        return self.sampling.params.max_tokens

    @property
    def prompt_logprobs(self) -> int | None:
        """echo: the prompt's log-probabilities, with this many alternatives (None: not asked for)."""
        return self.sampling.params.prompt_logprobs


@dataclass
class PrefillJob:
    """An admitted request (with its other choices in .forks) whose prompt is partly in its slot."""

    request: EngineRequest
    done: int = 0  # prompt tokens already in the slot
    prompt_entries: list[TokenLogprob] = field(default_factory=list)  # echo: the entries of the chunks so far

    @property
    def remaining(self) -> int:
        return len(self.request.prompt) - self.done


def choice_ids(request_id: str, n: int) -> list[str]:
    """The engine ids of a request's n choices: choice 0 is the request itself, choice j > 0 is "<id>/<j>"."""
    return [request_id] + [f"{request_id}/{j}" for j in range(1, n)]


def new_request(
    config: EngineConfig, vocab_size: int, max_len: int | None, request_id: str, prompt_tokens: list[int], params: SamplingParams,
) -> EngineRequest:
    """The checked request (its other choices in .forks), or AssayError naming what is wrong."""
    prompt = [int(t) for t in prompt_tokens]
    max_tokens, n = params.max_tokens, params.n
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
    if params.min_tokens and params.grammar is not None:
        raise AssayError("min_tokens cannot be combined with response_format or a forced tool_choice: the grammar decides where the output ends")
    stops = frozenset(params.stop_token_ids)
    if params.min_tokens and sum(1 for t in stops if 0 <= t < vocab_size) >= vocab_size:
        raise AssayError("min_tokens needs a token that is not a stop token: stop_token_ids cover the whole vocabulary")
    # Each choice reads its own history (the prompt, then its own tokens) for the penalties and min_tokens.
    members = [EngineRequest(choice_id, prompt, Sampling.for_choice(params, j, TokenHistory.start(params, prompt, vocab_size)), stops)
               for j, choice_id in enumerate(choice_ids(request_id, n))]
    members[0].forks = members[1:]
    return members[0]
