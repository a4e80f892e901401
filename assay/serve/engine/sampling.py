"""How the next token is chosen from a row of logits, and the log-probabilities a request asks for.

    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, seed=1)    # AssayError for bad values
    sampling = Sampling.for_choice(params, 0)                                 # choice 0 of n: its own generator
    tokens = sample_tokens(logits, [sampling, ...])                           # logits [N, vocab] -> N token ids
    entries = token_logprobs(logits, tokens, [sampling, ...])                  # the chosen tokens' log-probabilities
    entries = prompt_logprobs(all_logits, prompt, k)                           # a prompt's own (echo)

Order, as Transformers' logits processors apply them: first what the choice's own tokens do (min_tokens and
the repetition, presence and frequency penalties, serve/engine/penalties.py), then temperature, top-k, top-p
(the nucleus of the tempered distribution) and min-p, then one draw from what is left. Temperature 0 is
greedy over the penalized logits (top-k, top-p and min-p change nothing there). vLLM applies min-p before
top-k and top-p; the two orders differ only when min_p and top_p < 1 are asked for together. Sampling runs
on the CPU, outside the compiled decode graph, each request with its own torch.Generator, so a seed gives the
same tokens compiled or eager and whatever else shares the batch.

n choices of one prompt (Sampling.for_choice): choice j draws from its own generator seeded with seed + j (modulo
2**64), so choice 0 is the answer the same request with n = 1 gets, and a seeded request is reproducible.

Log-probabilities are log_softmax, in float32, of the logits that produced each token (the model's own
distribution, before temperature, top-k or top-p: vLLM's default "raw" log-probabilities).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from assay.core.errors import AssayError
from assay.serve.engine.penalties import TokenHistory, penalize

if TYPE_CHECKING:
    from assay.serve.guided import Grammar, GuidedMatcher

SEED_MODULUS = 2**64  # torch.Generator.manual_seed takes [-2**63, 2**64)
# A temperature below this is greedy (vLLM's _SAMPLING_EPS): dividing float32 logits by it would overflow to inf.
GREEDY_BELOW = 1e-5
# Positions of a prompt whose log_softmax is taken at once: bounds the float32 copy to this many x vocab.
PROMPT_LOGPROB_CHUNK = 256


@dataclass(frozen=True)
class TokenLogprob:
    """One position: the token there, its log-probability, and the k most likely tokens there (id, logprob)."""

    token_id: int
    logprob: float | None  # None: a prompt's first token (nothing precedes it)
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks of generation. Built once (at the HTTP edge, from the request's fields of the
    same names) and passed unchanged to the engine and the sampler; checked here (AssayError), the limits
    that depend on the server (max_tokens, n) at the engine's intake. A new sampling setting is a field here
    and its use in the sampler below (and the request's field of the same name in the HTTP protocol)."""

    max_tokens: int = 16
    n: int = 1  # choices of the prompt, prefilled once and copied
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1): every token
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings: the HTTP edge cuts the text at them (the engine sees token ids)
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # alternatives reported per generated token; None: no log-probabilities
    prompt_logprobs: int | None = None  # echo: the prompt's own log-probabilities, with this many alternatives
    # Penalties and floors as vLLM accepts them (serve/engine/penalties.py; min_p in warp_logits below).
    repetition_penalty: float = 1.0  # > 0; 1: none
    presence_penalty: float = 0.0  # in [-2, 2]
    frequency_penalty: float = 0.0  # in [-2, 2]
    min_p: float = 0.0  # in [0, 1]; 0: none
    min_tokens: int = 0  # the stop token ids are masked until this many tokens were generated
    # Structured outputs and forced tool calls: each choice decodes under its own matcher of this grammar
    # (engine/guidance.py masks the logits before the draw); None: free text.
    grammar: Grammar | None = None

    def __post_init__(self):
        try:
            temperature, top_p = float(self.temperature), float(self.top_p)
        except (TypeError, ValueError):
            raise AssayError(f"temperature and top_p must be numbers, got {self.temperature!r}, {self.top_p!r}") from None
        if not 0.0 <= temperature < float("inf"):
            raise AssayError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not 0.0 < top_p <= 1.0:
            raise AssayError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise AssayError(f"top_k must be an integer >= -1 (0 or -1: every token), got {self.top_k!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise AssayError(f"{name} must be an integer >= 0, got {value!r}")
        if self.seed is not None and not -(2**63) <= self.seed < SEED_MODULUS:
            raise AssayError(f"seed must be in [-2**63, 2**64), got {self.seed!r}")
        _check_penalties(self)
        # Canonical values (a frozen dataclass sets them through object.__setattr__): -1 and 0 both mean every token.
        for name, value in (("temperature", temperature), ("top_p", top_p), ("top_k", max(self.top_k, 0)),
                            ("stop", tuple(self.stop)), ("stop_token_ids", tuple(int(t) for t in self.stop_token_ids))):
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def penalizes(self) -> bool:
        """Whether the choice's own tokens change its logits (a penalty, or min_tokens)."""
        return self.repetition_penalty != 1.0 or bool(self.presence_penalty) or bool(self.frequency_penalty) or self.min_tokens > 0


def _check_penalties(params: SamplingParams) -> None:
    """vLLM's ranges for the penalties, min_p and min_tokens (AssayError naming the field)."""
    ranges = {"repetition_penalty": "> 0", "presence_penalty": "in [-2, 2]", "frequency_penalty": "in [-2, 2]", "min_p": "in [0, 1]"}
    for name, wanted in ranges.items():
        value = getattr(params, name)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise AssayError(f"{name} must be a number {wanted}, got {value!r}") from None
        inside = number > 0 if name == "repetition_penalty" else (0 <= number <= 1 if name == "min_p" else -2 <= number <= 2)
        if not (inside and math.isfinite(number)):
            raise AssayError(f"{name} must be a finite number {wanted}, got {value!r}")
        object.__setattr__(params, name, number)
    min_tokens = params.min_tokens
    if not isinstance(min_tokens, int) or isinstance(min_tokens, bool) or min_tokens < 0:
        raise AssayError(f"min_tokens must be an integer >= 0, got {min_tokens!r}")
    if isinstance(params.max_tokens, int) and min_tokens > params.max_tokens:
        raise AssayError(f"min_tokens ({min_tokens}) must be at most max_tokens ({params.max_tokens})")


@dataclass
class Sampling:
    """One choice's sampler: its request's SamplingParams, its own random stream (None when greedy) and, when
    the params penalize, its token history (penalties.TokenHistory, updated by append as tokens are emitted)."""

    params: SamplingParams
    generator: torch.Generator | None = None
    history: TokenHistory | None = None
    matcher: GuidedMatcher | None = None  # this choice's place in params.grammar (None: free text)

    @classmethod
    def create(cls, temperature: float = 0.0, seed: int | None = None, **fields) -> Sampling:
        """Choice 0 of SamplingParams(temperature=..., seed=..., **fields) (AssayError for bad values)."""
        return cls.for_choice(SamplingParams(temperature=temperature, seed=seed, **fields), 0)

    @classmethod
    def for_choice(cls, params: SamplingParams, index: int, history: TokenHistory | None = None) -> Sampling:
        """Choice `index` of n, with a generator of its own seeded with seed + index; a request without a seed
        gets a random one, so two such requests differ. history: the choice's own (TokenHistory.start). Under a
        grammar, each choice gets its own matcher."""
        matcher = params.grammar.matcher() if params.grammar is not None else None
        if params.greedy:
            return cls(params, history=history, matcher=matcher)
        seed = random.getrandbits(63) if params.seed is None else (params.seed + index) % SEED_MODULUS
        return cls(params, torch.Generator(device="cpu").manual_seed(seed), history=history, matcher=matcher)

    def fork(self, index: int) -> Sampling:
        """Choice `index`'s random stream (a choice's token history is its own: new_request starts one each)."""
        return Sampling.for_choice(self.params, index)

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def append(self, token: int) -> None:
        """The choice emitted `token`: the penalties and min_tokens read it from the next step on."""
        if self.history is not None:
            self.history.append(token)

    def choose(self, logits: torch.Tensor) -> int:
        """logits [vocab] float32 on the CPU -> the next token: the penalties, then greedy or a draw."""
        if self.history is not None:
            logits = penalize(logits, self.params, self.history)
        return int(logits.argmax()) if self.greedy else self.draw(logits)

    def draw(self, logits: torch.Tensor) -> int:
        """logits [vocab] float32 on the CPU -> one token: temperature, top-k, top-p, min-p, then a draw."""
        probs = torch.softmax(warp_logits(logits, self.params), dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator).item())


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [vocab] float32 -> temperature, top-k, top-p, then min-p (Transformers' MinPLogitsWarper: a token
    whose probability is below min_p times the top token's is dropped); what is dropped is -inf."""
    scaled = logits / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        # Keep the smallest head whose mass reaches top_p: a token stays if the mass before it is below top_p.
        drop = torch.cumsum(probs, dim=-1) - probs >= params.top_p
        drop[0] = False  # the most likely token stays: a top_p below float32's smallest number rounds to 0
        scaled = scaled.scatter(-1, order[drop], float("-inf"))
    if params.min_p > 0.0:
        probs = torch.softmax(scaled, dim=-1)
        # min_p <= 1: the top token (probability == the max) always stays.
        dropped = probs < params.min_p * probs.amax(dim=-1, keepdim=True)
        scaled = scaled.masked_fill(dropped, float("-inf"))
    return scaled


def sample_tokens(logits: torch.Tensor, rows: Sequence[Sampling]) -> list[int]:
    """logits [N, vocab] (any float dtype, any device) -> the next token of each row."""
    # Greedy rows without penalties in one argmax; the others each through their own penalties and generator.
    logits = logits.float().cpu()
    tokens = logits.argmax(-1).tolist()
    for row, sampling in enumerate(rows):
        if not sampling.greedy or sampling.history is not None:
            tokens[row] = sampling.choose(logits[row])
    return tokens


def _entries(logprobs: torch.Tensor, tokens: Sequence[int], k: int) -> list[TokenLogprob]:
    # logprobs: [N, vocab] float32; tokens: N ids -> N entries with the top k of each row
    chosen = logprobs.gather(-1, torch.tensor(tokens, dtype=torch.int64, device=logprobs.device)[:, None])[:, 0].tolist()
    if k > 0:
        values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]), dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        tops = [()] * len(tokens)
    return [TokenLogprob(int(t), lp, top) for t, lp, top in zip(tokens, chosen, tops)]


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], rows: Sequence[Sampling]) -> list[TokenLogprob | None]:
    """logits [N, vocab] -> for each row that asks for them, its chosen token's log-probability and top k."""
    wanted = [row for row, sampling in enumerate(rows) if sampling.params.logprobs is not None]
    result: list[TokenLogprob | None] = [None] * len(rows)
    if not wanted:
        return result
    logprobs = torch.log_softmax(logits[wanted].float(), dim=-1)
    for i, row in enumerate(wanted):
        result[row] = _entries(logprobs[i : i + 1], [tokens[row]], rows[row].params.logprobs)[0]
    return result


def prompt_logprobs(logits: torch.Tensor, prompt: Sequence[int], k: int) -> list[TokenLogprob]:
    """logits [T, vocab] of a prompt's prefill (all positions) -> one entry per prompt token: the first has
    no log-probability, token t's comes from the logits at t - 1."""
    entries = [TokenLogprob(int(prompt[0]), None)]
    for start in range(0, len(prompt) - 1, PROMPT_LOGPROB_CHUNK):
        end = min(start + PROMPT_LOGPROB_CHUNK, len(prompt) - 1)
        logprobs = torch.log_softmax(logits[start:end].float(), dim=-1)
        entries += _entries(logprobs, prompt[start + 1:end + 1], k)
    return entries


__all__ = ["Sampling", "SamplingParams", "TokenLogprob", "prompt_logprobs", "sample_tokens", "token_logprobs", "warp_logits"]
