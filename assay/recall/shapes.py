"""What a recall run is made of, without torch: the architectures compared, a model's size, the MQAR
token layout. `assay recall train` checks a request against these before importing torch, so a
wrong flag answers at once; models.py and mqar.py build on them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from assay.core.errors import AssayError

ARCHS = ("gla", "qwen3")


@dataclass(frozen=True)
class ModelSize:
    """Shared by both architectures. dim 64 / 2 layers / 4 heads are the zoo's tiny sizes: small enough
    to train for minutes on two CPU cores, with a GLA state (4 KB) far below the KV cache at 256 tokens."""

    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    hidden_dim: int = 128
    vocab_size: int = 1024
    max_seq_len: int = 8192  # attention's rotary table (and the needle's longest prompt); GLA records it only
    gla_expand_k: float = 0.5  # GLA's key width / dim: with n_heads, sets its state (n_layers x dim^2 x expand_k / heads)
    # Standard deviation of the random matrices (both architectures). Transformers' 0.02 is a small init at
    # width 64: the two-layer lookup circuit then sits on the copy plateau for thousands of steps (docs/recall.md).
    init_std: float = 0.02
    # fla's short convolutions on GLA's q, k, v (GLAArgs.use_short_conv): what lets the fixed state bind a
    # key to the value after it (docs/recall.md, "Short convolutions"); attention has no such field.
    gla_short_conv: bool = False


@dataclass(frozen=True)
class MQARLayout:
    """Where keys, values and filler live in the vocabulary. The defaults fit the zoo tokenizer's 1,024
    ids: specials and a margin below 64, then 256 keys, 256 values, and the rest filler."""

    vocab_size: int = 1024
    first_key: int = 64
    n_keys: int = 256
    n_values: int = 256

    def __post_init__(self) -> None:
        if self.n_keys < 1 or self.n_values < 2 or self.first_key < 0:
            raise AssayError(f"invalid MQAR token layout: {self}")
        if self.first_filler + 1 > self.vocab_size:
            raise AssayError(f"MQAR keys and values ({self.n_keys} + {self.n_values} from id {self.first_key}) "
                             f"leave no filler ids in a vocabulary of {self.vocab_size}")

    @property
    def first_value(self) -> int:
        return self.first_key + self.n_keys

    @property
    def first_filler(self) -> int:
        return self.first_value + self.n_values

    @property
    def n_filler(self) -> int:
        return self.vocab_size - self.first_filler

    @property
    def chance(self) -> float:
        """Accuracy of a predictor that guesses uniformly among the value tokens."""
        return 1.0 / self.n_values

    def is_key(self, token: int) -> bool:
        return self.first_key <= token < self.first_value

    def as_dict(self) -> dict:
        return asdict(self)


ZOO_VOCAB = 1024  # the zoo tokenizer's ids: the default vocabulary of a recall model


def layout_for(keys: int, filler: int | None = None) -> MQARLayout:
    """`keys` keys and as many values; `filler` filler ids (None: the rest of the zoo's 1,024 ids).

    The model's vocabulary is the layout's (recall.train): a compact one (e.g. 64 filler ids) shrinks the
    output head, which is most of a tiny model's step: only values are ever scored.
    """
    base = MQARLayout(n_keys=keys, n_values=keys)
    if filler is None:
        return base
    if filler < 1:
        raise AssayError(f"--filler must be >= 1 (got {filler})")
    return MQARLayout(vocab_size=base.first_filler + filler, n_keys=keys, n_values=keys)
