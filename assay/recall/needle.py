"""`assay recall needle`: a fact hidden at a chosen depth of a long prompt, the model asked for it. No training.

Two formats:
  text    filler prose from the embedded corpus with "The secret number of <name> is <digits>." at the
          depth, then "... What is the secret number of <name>? The secret number of <name> is"; the
          answer counts when the greedy continuation's first run of digits equals <digits>.
  tokens  for models trained by `recall train` (their recall.json gives the MQAR token layout): filler
          tokens with one key-value pair at the depth and the key asked at the end; the answer counts
          when the next token is the value.
Prompts are exactly `length` tokens. Depth 0 puts the needle first, 1 right before the question.

How each model answers:
  a registered architecture (GLA, Qwen3, Llama: assay.models.registry)
                          its slot model, as the serving engine runs it: prefill(prompt[:-1]) into one
                          slot, then a decode step per token; the KV cache or the fixed state carries the
                          whole history.
  any Transformers LM     generate(do_sample=False).
A length beyond a model's maximum positions is a cell marked "skipped", not a failure of the run.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, field

import torch

from assay.core.errors import AssayError

FORMATS = ("auto", "text", "tokens")
NAMES = ("Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kiri", "Lena")
ANSWER_DIGITS = 4


@dataclass(frozen=True)
class NeedleRequest:
    model: str
    lengths: tuple[int, ...] = (512, 2048, 8192)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    trials: int = 4
    format: str = "auto"  # auto: tokens for a `recall train` checkpoint, text for any other model
    device: str = "cpu"
    seed: int = 0
    progress: bool = False


@dataclass
class NeedleResult:
    model: str
    kind: str  # the registry entry's name (gla, qwen3, llama) or hf
    format: str
    max_positions: int | None
    cells: list[dict] = field(default_factory=list)  # one per (length, depth)
    chance: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    def grid(self, lengths: list[int], depths: list[float]) -> list[list[float | None]]:
        """accuracy[length][depth], None where skipped."""
        by_cell = {(c["length"], c["depth"]): c["accuracy"] for c in self.cells}
        return [[by_cell.get((length, depth)) for depth in depths] for length in lengths]


# ---------------------------------------------------------------- the model, whichever kind


class NeedleModel:
    """One loaded checkpoint behind `answer(prompt_ids, n_new) -> new token ids` (greedy)."""

    def __init__(self, checkpoint: str, device: torch.device):
        from assay.models import registry
        from assay.models.hf_checkpoint import checkpoint_dir, read_hf_config

        self.folder = checkpoint_dir(checkpoint)
        self.device = device
        config = read_hf_config(self.folder)
        spec = registry.find(config.get("model_type"))
        if spec is not None:
            try:
                spec.args_from_hf(config)
            except AssayError:  # a variant the native model does not run (a binding sliding window): Transformers does
                spec = None
        self.slot_model = None
        if spec is not None:  # a registered architecture: assay's own model, answered through its slot model
            model, args = spec.load(self.folder, None, False, device, torch.float32)
            self.model = model.eval()
            self.slot_model = spec.wrap_slot_model(self.model, args)
            self.kind = spec.name
            # A fixed state has no positional table: any length runs (max_seq_len is recorded only).
            self.max_positions = self.slot_model.max_positions()
            self.vocab_size = int(args.vocab_size)
        else:
            from transformers import AutoModelForCausalLM

            try:
                self.model = AutoModelForCausalLM.from_pretrained(self.folder, dtype=torch.float32).to(device)
            except (OSError, ValueError, KeyError) as error:
                raise AssayError(f"Transformers cannot load {self.folder} as a causal LM: {str(error).splitlines()[0]}") from None
            self.kind = "hf"
            positions = config.get("max_position_embeddings") or config.get("n_positions")
            self.max_positions = int(positions) if positions else None
            self.vocab_size = int(self.model.config.vocab_size)
        self.model.eval()

    def fits(self, total_tokens: int) -> bool:
        return self.max_positions is None or total_tokens <= self.max_positions

    @torch.no_grad()
    def answer(self, prompt: torch.Tensor, n_new: int) -> list[int]:
        """prompt: [T] token ids -> n_new greedily generated ids."""
        tokens = prompt.to(self.device).unsqueeze(0)  # [1, T]
        if self.slot_model is not None:
            return self._answer_native(tokens, n_new)
        attention_mask = torch.ones_like(tokens)
        output = self.model.generate(input_ids=tokens, attention_mask=attention_mask, max_new_tokens=n_new, min_new_tokens=n_new,
                                     do_sample=False, pad_token_id=self.model.config.pad_token_id or 0)
        return output[0, tokens.shape[1]:].tolist()

    def _answer_native(self, tokens: torch.Tensor, n_new: int) -> list[int]:
        # The serving path, one slot: prefill all but the last prompt token, then decode it and each new
        # token at its position, so the answer comes out of the cache (KV or fixed state) a server keeps.
        length = tokens.shape[1]
        buffers = self.slot_model.pool_buffers(1, torch.float32, length + n_new)
        slot_ids = torch.zeros(1, dtype=torch.int64, device=tokens.device)
        self.slot_model.prefill(tokens[:, :-1], 0, buffers)
        next_token, position = tokens[:, -1:], length - 1
        generated = []
        for _ in range(n_new):
            positions = torch.tensor([position], dtype=torch.int64, device=tokens.device)
            logits = self.slot_model.decode(next_token, slot_ids, positions, buffers)  # [1, vocab]
            next_token = logits.argmax(-1, keepdim=True)  # [1, 1]
            generated.append(int(next_token))
            position += 1
        return generated


# ---------------------------------------------------------------- prompts


@functools.lru_cache(maxsize=4)
def _corpus_ids(tokenizer_dir: str) -> torch.Tensor:
    from assay.zoo.corpus import corpus_text

    tokenizer = _tokenizer(tokenizer_dir)
    return torch.tensor(tokenizer(corpus_text(), add_special_tokens=False, verbose=False)["input_ids"], dtype=torch.long)


@functools.lru_cache(maxsize=4)
def _tokenizer(folder: str):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    # Quiet: for a model type Transformers does not know (GLA) it warns about the config, not the tokenizer.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise AssayError(f"the text needle needs a tokenizer; cannot load the one of {folder}: {str(error).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def _insert(filler: torch.Tensor, needle: torch.Tensor, depth: float) -> torch.Tensor:
    at = round(depth * len(filler))
    return torch.cat([filler[:at], needle, filler[at:]])


def text_prompt(folder: str, length: int, depth: float, generator: torch.Generator) -> tuple[torch.Tensor, str] | None:
    """(prompt ids of exactly `length` tokens, the digits to answer), or None when `length` is too short."""
    tokenizer = _tokenizer(folder)
    name = NAMES[int(torch.randint(0, len(NAMES), (1,), generator=generator))]
    digits = "".join(str(int(d)) for d in torch.randint(0, 10, (ANSWER_DIGITS,), generator=generator))
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    needle = torch.tensor(encode(f" The secret number of {name} is {digits}. "), dtype=torch.long)
    question = torch.tensor(encode(f"\n\nWhat is the secret number of {name}? The secret number of {name} is"), dtype=torch.long)
    corpus = _corpus_ids(folder)
    room = length - len(needle) - len(question)
    if room < 0 or room >= len(corpus):
        return None
    start = int(torch.randint(0, len(corpus) - room, (1,), generator=generator))
    return torch.cat([_insert(corpus[start:start + room], needle, depth), question]), digits


def token_prompt(layout, length: int, depth: float, generator: torch.Generator) -> tuple[torch.Tensor, int]:
    """MQAR tokens: filler with "key value" at the depth, then the key; (prompt of `length` ids, the value id)."""
    key = layout.first_key + int(torch.randint(0, layout.n_keys, (1,), generator=generator))
    value = layout.first_value + int(torch.randint(0, layout.n_values, (1,), generator=generator))
    filler = layout.first_filler + torch.randint(0, layout.n_filler, (length - 3,), generator=generator)
    return torch.cat([_insert(filler, torch.tensor([key, value]), depth), torch.tensor([key])]), value


def first_digits(text: str) -> str | None:
    found = re.search(r"\d+", text)
    return found.group(0) if found else None


# ---------------------------------------------------------------- the probe


def _validate(request: NeedleRequest) -> None:
    if request.format not in FORMATS:
        raise AssayError(f"--format {request.format!r}: expected one of {', '.join(FORMATS)}")
    if not request.lengths or not request.depths:
        raise AssayError("--lengths and --depths each need at least one value")
    for length in request.lengths:
        if length < 16:
            raise AssayError(f"--lengths {length}: a needle prompt needs at least 16 tokens")
    for depth in request.depths:
        if not 0.0 <= depth <= 1.0:
            raise AssayError(f"--depths {depth}: depths are fractions from 0 to 1")
    if request.trials < 1:
        raise AssayError(f"--trials must be >= 1 (got {request.trials})")


def run_needle(request: NeedleRequest) -> NeedleResult:
    from assay.core.device import resolve_device
    from assay.core.progress import progress_bar
    from assay.recall.models import read_layout

    _validate(request)
    model = NeedleModel(request.model, resolve_device(request.device))
    layout = read_layout(model.folder)
    fmt = request.format if request.format != "auto" else ("tokens" if layout is not None else "text")
    if fmt == "tokens":
        if layout is None:
            raise AssayError(f"--format tokens needs a checkpoint written by `assay recall train` ({model.folder} has no recall.json)")
        if layout.vocab_size > model.vocab_size:
            raise AssayError(f"the recall layout spans {layout.vocab_size} ids; the model's vocabulary has {model.vocab_size}")
    result = NeedleResult(str(request.model), model.kind, fmt, model.max_positions,
                          chance=layout.chance if fmt == "tokens" else 10.0 ** -ANSWER_DIGITS)
    n_new = 1 if fmt == "tokens" else ANSWER_DIGITS + 3  # the tokenizer may split the digits or lead with a space
    cells = [(length, depth) for length in request.lengths for depth in request.depths]
    with progress_bar("needle", total=len(cells), enabled=request.progress) as advance:
        for index, (length, depth) in enumerate(cells):
            result.cells.append(_cell(model, fmt, layout, length, depth, request, n_new, index))
            advance(f"{length} tokens, depth {depth}")
    return result


def _cell(model: NeedleModel, fmt: str, layout, length: int, depth: float, request: NeedleRequest, n_new: int, index: int) -> dict:
    cell = {"length": length, "depth": depth, "trials": request.trials, "correct": None, "accuracy": None, "status": "ok", "reason": None,
            "examples": []}
    if not model.fits(length + n_new):
        cell |= {"status": "skipped", "reason": f"{length} + {n_new} tokens exceed the model's {model.max_positions} positions"}
        return cell
    # The same (seed, cell) gives the same prompts to every model: grids of two models compare like for like.
    generator = torch.Generator().manual_seed(request.seed * 1_000_003 + index)
    correct = 0
    for _ in range(request.trials):
        if fmt == "tokens":
            prompt, value = token_prompt(layout, length, depth, generator)
            predicted = model.answer(prompt, 1)[0]
            hit, shown = predicted == value, {"expected": value, "got": predicted}
        else:
            made = text_prompt(str(model.folder), length, depth, generator)
            if made is None:
                cell |= {"status": "skipped", "reason": f"{length} tokens cannot hold the needle, the question and filler from the corpus"}
                return cell
            prompt, digits = made
            text = _tokenizer(str(model.folder)).decode(model.answer(prompt, n_new), skip_special_tokens=True)
            hit, shown = first_digits(text) == digits, {"expected": digits, "got": text}
        correct += int(hit)
        if len(cell["examples"]) < 2:
            cell["examples"].append(shown)
    cell |= {"correct": correct, "accuracy": correct / request.trials}
    return cell
