"""The soak's client kinds (bench/serve/soak.py drives them): each sends one request of its kind to a
running `assay serve` and classifies what came back into an Outcome.

Every kind names the outcomes it expects. Anything else is a failure: a hang (no byte for `timeout`
seconds, or the whole answer later than `deadline`), a 5xx, a broken connection, a 200 whose body is not
whole (a choice without a finish reason, a stream without exactly one [DONE]), or a refusal with another
status than the one the kind asks for (e.g. 422 where an unknown field must get 400).
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import httpx

# Outcome classes. answered / refused_* / disconnected are a server doing its job; the rest are failures.
ANSWERED, REFUSED_429, DISCONNECTED = "answered", "refused_429", "disconnected"
HARD = ("hang", "server_error", "transport_error", "incomplete")


@dataclass
class Outcome:
    kind: str
    outcome: str  # ANSWERED, REFUSED_429, DISCONNECTED, "refused_<status>", or one of HARD, or "unexpected_<status>"
    status: int | None
    start: float  # seconds since the soak began
    seconds: float
    ttft: float | None = None  # streamed kinds: send -> first token event, at the client
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome in HARD or self.outcome.startswith("unexpected")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Setup:
    """What the clients know of the server: its URL, model, and the limits it was started with."""

    url: str
    model: str
    max_seqs: int
    max_prompt_tokens: int
    max_new_tokens: int
    max_request_bytes: int
    timeout: float  # no byte for this long: a hang
    deadline: float  # the whole answer later than this: a hang
    api_key: str  # every /v1/* request carries it, except the wrong_key kind's


WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "small", "birds", "sing",
         "about", "rain", "and", "old", "stone", "bridges", "near", "quiet", "river", "naïve", "café", "日本語", "🙂", "Ωμέγα")


def text(rng: random.Random, words: int) -> str:
    """Words, some of them several bytes and up to about 10 tokens each: 32 words fit in 512 tokens."""
    return " ".join(rng.choice(WORDS) for _ in range(words))


def messages(rng: random.Random) -> list[dict]:
    chat = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": text(rng, rng.randint(3, 12))}]
    if rng.random() < 0.5:
        chat += [{"role": "assistant", "content": text(rng, 4)}, {"role": "user", "content": text(rng, 6)}]
    return chat


class Client:
    """One thread's connection pool and random source; run(kind) sends one request of that kind."""

    def __init__(self, setup: Setup, rng: random.Random, clock: Callable[[], float]):
        self.setup, self.rng, self.clock = setup, rng, clock
        self.http = httpx.Client(base_url=setup.url, timeout=httpx.Timeout(setup.timeout, connect=10.0),
                                 headers={"Authorization": f"Bearer {setup.api_key}"})

    def close(self) -> None:
        self.http.close()

    def run(self, kind: str) -> Outcome:
        start = self.clock()
        began = time.perf_counter()
        try:
            outcome, status, ttft, detail = KINDS[kind][0](self)
        except httpx.TimeoutException as exc:
            outcome, status, ttft, detail = "hang", None, None, f"{type(exc).__name__} after {time.perf_counter() - began:.1f} s"
        except (httpx.TransportError, OSError) as exc:
            outcome, status, ttft, detail = "transport_error", None, None, f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - began
        if outcome not in HARD and seconds > self.setup.deadline:
            outcome, detail = "hang", f"answered after {seconds:.1f} s (deadline {self.setup.deadline:.0f} s)"
        if outcome not in HARD and outcome not in KINDS[kind][1]:
            outcome, detail = f"unexpected_{status}", f"expected {'/'.join(KINDS[kind][1])}; {detail}"
        return Outcome(kind, outcome, status, round(start, 3), round(seconds, 4), ttft, detail[:300])

    # ------------------------------------------------------------ the generating kinds

    def completion_body(self, **extra) -> dict:
        prompt = text(self.rng, self.rng.randint(2, 32)) if self.rng.random() < 0.7 else [self.rng.randrange(3, 200) for _ in range(12)]
        return {"model": self.setup.model, "prompt": prompt, "max_tokens": self.rng.randint(1, 32), "temperature": 0} | extra

    def chat_body(self, **extra) -> dict:
        return {"model": self.setup.model, "messages": messages(self.rng), "max_tokens": self.rng.randint(1, 24), "temperature": 0} | extra

    def plain(self, route: str, body: dict, check: Callable[[dict], str]) -> tuple:
        response = self.http.post(route, json=body)
        if response.status_code != 200:
            return refusal(response)
        problem = check(response.json())
        return ("incomplete" if problem else ANSWERED), 200, None, problem

    def streamed(self, route: str, body: dict, chat: bool, leave_after: int | None = None) -> tuple:
        """A streamed request read to [DONE] (or, leave_after: closed after that many token events)."""
        sent = time.perf_counter()
        ttft, events, done, finishes, after_done = None, 0, 0, {}, 0
        with self.http.stream("POST", route, json=body) as response:
            if response.status_code != 200:
                response.read()
                return refusal(response)
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                if done:
                    after_done += 1
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    done += 1
                    continue
                event = json.loads(payload)
                if "error" in event:
                    return "server_error", 200, ttft, f"error event in the stream: {event['error'].get('message', '')[:200]}"
                for choice in event.get("choices", []):
                    if chat and "role" in choice.get("delta", {}):
                        continue  # the opening chunk names the role: no token yet
                    if ttft is None:
                        ttft = time.perf_counter() - sent
                    events += 1
                    if choice.get("finish_reason"):
                        finishes[choice["index"]] = finishes.get(choice["index"], 0) + 1
                if leave_after is not None and events >= leave_after:
                    return DISCONNECTED, 200, ttft, f"left after {events} events"
        n = body.get("n", 1)
        if done != 1 or after_done or sorted(finishes) != list(range(n)) or any(c != 1 for c in finishes.values()):
            return "incomplete", 200, ttft, f"{done} [DONE] ({after_done} events after it), finish reasons per choice {finishes}"
        if leave_after is not None:
            return DISCONNECTED, 200, ttft, "the answer ended before the client left"
        return ANSWERED, 200, ttft, ""

    def completion(self) -> tuple:
        return self.plain("/v1/completions", self.completion_body(), check_choices("text"))

    def completion_stream(self) -> tuple:
        return self.streamed("/v1/completions", self.completion_body(stream=True), chat=False)

    def chat(self) -> tuple:
        return self.plain("/v1/chat/completions", self.chat_body(), check_choices("message"))

    def chat_stream(self) -> tuple:
        return self.streamed("/v1/chat/completions", self.chat_body(stream=True, stream_options={"include_usage": True}), chat=True)

    def sampling(self) -> tuple:
        """logprobs, n and seed on either route; echo with logprobs (what lm-eval sends); n and stop strings streamed."""
        seed = self.rng.randrange(2**31)
        choice = self.rng.randrange(4)
        if choice == 0:
            body = self.completion_body(n=2, logprobs=2, seed=seed, temperature=0.8, top_p=0.9)
            return self.plain("/v1/completions", body, check_choices("text", n=2, logprobs="legacy"))
        if choice == 1:
            body = self.completion_body(echo=True, logprobs=1, max_tokens=1)
            return self.plain("/v1/completions", body, check_choices("text", logprobs="legacy"))
        if choice == 2:
            body = self.chat_body(n=2, logprobs=True, top_logprobs=2, seed=seed, temperature=0.8)
            return self.plain("/v1/chat/completions", body, check_choices("message", n=2, logprobs="chat"))
        body = self.completion_body(n=2, seed=seed, temperature=1.0, top_k=20, stop=[" the", "e"], stream=True)
        return self.streamed("/v1/completions", body, chat=False)

    def disconnect_stream(self) -> tuple:
        """Streams a long answer and closes the connection after a few token events."""
        route, chat = self.rng.choice([("/v1/completions", False), ("/v1/chat/completions", True)])
        body = (self.chat_body if chat else self.completion_body)(stream=True, max_tokens=self.setup.max_new_tokens, ignore_eos=True,
                                                                 n=self.rng.choice([1, 1, 2]))
        return self.streamed(route, body, chat=chat, leave_after=self.rng.randint(1, 4))

    def auth(self) -> str:
        return f"Authorization: Bearer {self.setup.api_key}\r\nContent-Type: application/json\r\n"

    def disconnect_plain(self) -> tuple:
        """A non-streamed long request over a raw socket, closed before the answer comes."""
        body = json.dumps(self.completion_body(max_tokens=self.setup.max_new_tokens, ignore_eos=True, n=self.rng.choice([1, 2]))).encode()
        host, port = self.setup.url.removeprefix("http://").rsplit(":", 1)
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n{self.auth()}Content-Length: {len(body)}\r\n\r\n"
        with socket.create_connection((host, int(port)), timeout=self.setup.timeout) as sock:
            sock.sendall(head.encode() + body)
            time.sleep(self.rng.uniform(0.02, 0.3))
        return DISCONNECTED, None, None, ""

    def partial_body(self) -> tuple:
        """Headers that announce a body, part of it, then the connection closed (the server waits for the rest)."""
        body = json.dumps(self.completion_body()).encode()
        host, port = self.setup.url.removeprefix("http://").rsplit(":", 1)
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n{self.auth()}Content-Length: {len(body) + 100}\r\n\r\n"
        with socket.create_connection((host, int(port)), timeout=self.setup.timeout) as sock:
            sock.sendall(head.encode() + body[: self.rng.randrange(len(body))])
            time.sleep(self.rng.uniform(0.01, 0.2))
        return DISCONNECTED, None, None, ""

    # ------------------------------------------------------------ the refused kinds

    def raw(self, route: str, content) -> tuple:
        return refusal(self.http.post(route, content=content, headers={"content-type": "application/json"}))

    def malformed_json(self) -> tuple:
        bodies = [b'{"prompt": "abc", ', b"not json at all", b'{"prompt": "a"}}', b"[1, 2, 3]", b""]
        return self.raw(self.rng.choice(["/v1/completions", "/v1/chat/completions"]), self.rng.choice(bodies))

    def unknown_field(self) -> tuple:
        route, body = self.rng.choice([
            ("/v1/completions", self.completion_body(frobnicate=1)),
            ("/v1/completions", self.completion_body(best_of=3)),  # OpenAI's, not implemented: named, not dropped
            # The deprecated form of tools, not implemented (tools and tool_choice are): named, not dropped.
            ("/v1/chat/completions", self.chat_body(functions=[{"name": "f", "parameters": {"type": "object"}}])),
            ("/v1/chat/completions", self.chat_body(temprature=0.5)),
        ])
        return refusal(self.http.post(route, json=body))

    def bad_value(self) -> tuple:
        body = self.rng.choice([self.completion_body(max_tokens="8"), self.completion_body(temperature=-1), self.completion_body(n=0)])
        return refusal(self.http.post("/v1/completions", json=body))

    def wrong_key(self) -> tuple:
        """No Authorization header, or another key: 401, whatever the body."""
        headers = self.rng.choice([{"Authorization": ""}, {"Authorization": "Bearer not-the-key"}, {"Authorization": self.setup.api_key}])
        route = self.rng.choice(["/v1/completions", "/v1/chat/completions", "/v1/models"])
        if route == "/v1/models":
            return refusal(self.http.get(route, headers=headers))
        return refusal(self.http.post(route, json=self.completion_body(), headers=headers))

    def invalid_utf8(self) -> tuple:
        bodies = [b'{"prompt": "caf\xe9"}', b'{"prompt": "\xff\xfe"}', b'{"messages": [{"role": "user", "content": "\xc3"}]}']
        return self.raw(self.rng.choice(["/v1/completions", "/v1/chat/completions"]), self.rng.choice(bodies))

    def over_limit(self) -> tuple:
        """Over a limit: a prompt over --max-prompt-tokens (ids, text), a body over --max-request-bytes (whole or
        chunked, no Content-Length), max_tokens over --max-new-tokens, n over the slots."""
        limit = self.setup.max_prompt_tokens
        choice = self.rng.randrange(6)
        if choice == 0:
            return refusal(self.http.post("/v1/completions", json=self.completion_body(prompt=[7] * (limit + 1))))
        if choice == 1:
            return refusal(self.http.post("/v1/completions", json=self.completion_body(prompt="x" * (limit * 300))))
        if choice == 2:
            padding = "y" * (self.setup.max_request_bytes + 1)
            return refusal(self.http.post("/v1/chat/completions", json=self.chat_body(messages=[{"role": "user", "content": padding}])))
        if choice == 3:
            chunks = [b'{"prompt": "'] + [b"z" * 65536] * (self.setup.max_request_bytes // 65536 + 1) + [b'"}']
            return self.raw("/v1/completions", iter(chunks))
        if choice == 4:
            return refusal(self.http.post("/v1/completions", json=self.completion_body(max_tokens=self.setup.max_new_tokens + 1)))
        return refusal(self.http.post("/v1/completions", json=self.completion_body(n=self.setup.max_seqs + 1)))

    def burst_member(self) -> tuple:
        """One of a burst of long requests sent at once, more than the slots and the queue hold (some with n = 2:
        they wait for two free slots at once)."""
        n = self.rng.choice([1, 1, 1, 2])
        body = self.completion_body(max_tokens=self.setup.max_new_tokens, ignore_eos=True, n=n)
        return self.plain("/v1/completions", body, check_choices("text", n=n))


def refusal(response: httpx.Response) -> tuple:
    status = response.status_code
    try:
        error = response.json().get("error", {})
        message = error.get("message", "") if isinstance(error, dict) else str(error)
    except ValueError:
        message = response.text[:200]
    if status >= 500:
        return "server_error", status, None, message
    if status == 429:
        return REFUSED_429, status, None, message
    if status == 200:
        return "incomplete", status, None, "200 where a refusal was expected"
    if not message:
        return "incomplete", status, None, f"{status} without an error message"
    return f"refused_{status}", status, None, message


def check_choices(field: str, n: int = 1, logprobs: str | None = None) -> Callable[[dict], str]:
    """A checker of a whole (non-streamed) answer: what is wrong with it, or ""."""

    def check(body: dict) -> str:
        choices = body.get("choices", [])
        if sorted(c.get("index") for c in choices) != list(range(n)):
            return f"choice indices {[c.get('index') for c in choices]}, expected 0..{n - 1}"
        for c in choices:
            if c.get("finish_reason") not in ("length", "stop"):
                return f"choice {c.get('index')}: finish_reason {c.get('finish_reason')!r}"
            content = c.get("text") if field == "text" else (c.get("message") or {}).get("content")
            if not isinstance(content, str):
                return f"choice {c.get('index')}: no {field}"
            if logprobs == "legacy" and len((c.get("logprobs") or {}).get("token_logprobs", [])) < 1:
                return f"choice {c.get('index')}: no token_logprobs"
            if logprobs == "chat" and not (c.get("logprobs") or {}).get("content"):
                return f"choice {c.get('index')}: no logprobs content"
        if not isinstance(body.get("usage", {}).get("completion_tokens"), int):
            return "no usage"
        return ""

    return check


OK = (ANSWERED, REFUSED_429)
# kind -> (the method, the outcomes it expects), and how many of each go into one deck of the mix.
KINDS: dict[str, tuple[Callable[[Client], tuple], tuple[str, ...]]] = {
    "completion": (Client.completion, OK),
    "completion_stream": (Client.completion_stream, OK),
    "chat": (Client.chat, OK),
    "chat_stream": (Client.chat_stream, OK),
    "sampling": (Client.sampling, OK),
    "disconnect_stream": (Client.disconnect_stream, (DISCONNECTED, REFUSED_429)),
    "disconnect_plain": (Client.disconnect_plain, (DISCONNECTED,)),
    "partial_body": (Client.partial_body, (DISCONNECTED,)),
    "malformed_json": (Client.malformed_json, ("refused_400",)),
    "unknown_field": (Client.unknown_field, ("refused_400",)),
    "bad_value": (Client.bad_value, ("refused_422",)),
    "invalid_utf8": (Client.invalid_utf8, ("refused_400",)),
    "wrong_key": (Client.wrong_key, ("refused_401",)),
    "over_limit": (Client.over_limit, ("refused_400", "refused_413")),
    "burst_member": (Client.burst_member, OK),
}
DECK = {"completion": 4, "completion_stream": 4, "chat": 3, "chat_stream": 3, "sampling": 2, "disconnect_stream": 2,
        "disconnect_plain": 1, "partial_body": 1, "malformed_json": 1, "unknown_field": 1, "bad_value": 1, "invalid_utf8": 1,
        "wrong_key": 1, "over_limit": 1}
