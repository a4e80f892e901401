"""The reference cache: the CPU eager reference run's tokens, top-5 ids and raw logits, kept across sweeps.

Why it can be cached: the reference is a CPU eager run of the checkpoint. It depends on the checkpoint,
the prompt and generation settings (recipe.py), the dtype, the number of new tokens and the reference
stack (torch and Transformers versions), never on the device or the compiler under test. A warm sweep
of a new stack therefore needs only the compiled run.

The key (a SHA-256 over a JSON document, see `reference_key`):
- checkpoint content: every file of the checkpoint folder (weights, config, tokenizer, generation
  config), each hashed incrementally in full (BLAKE2b, 8 MiB reads) with its name and size. Full
  content, not header hashes: two checkpoints of one architecture (a random and a trained one) have
  equal headers and sizes, and must not share a reference. Hashing a 1 GB checkpoint costs about a
  second; the zoo's costs milliseconds. Hub ids that are not local folders are not cached (a revision
  can change under the same id).
- recipe.py's source (the prompt, the synthetic image and the generate settings), task, dtype,
  new_tokens, and the torch and Transformers versions.

The eval reference (`--eval`, evaluation.py) is cached the same way, one entry per task:
<root>/<key[:2]>/<key>.eval.json, keyed by the checkpoint's content, the task's content (its configuration
and every document: eval_recipe.task_content_sha256), eval/recipe.py's source, the reference dtype and
the torch, Transformers and lm-eval versions.

Entries: <root>/<key[:2]>/<key>.json, and the logits beside it in <key>.logits.pt (torch.save; schema 4's
drift columns; an entry without them counts as a miss), written to a temporary name and renamed (atomic, so concurrent
sweeps never see half an entry; the last writer of one key wins with equal content). On reading,
an entry whose JSON does not parse, whose key or checksum does not match, or whose lengths are not
what the request asks for is ignored (a miss), and the probe's fresh reference overwrites it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from assay.compat.probe.request import ProbePlan
from assay.core.files import atomic_write_json, user_cache_dir

FORMAT = 1  # bump when what an entry holds changes
EVAL_FORMAT = 1
CHUNK = 8 * 2**20
TOP_K = 5


def default_root() -> Path:
    """~/.cache/assay/references, or $XDG_CACHE_HOME/assay/references."""
    return user_cache_dir("references")


def _file_digest(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


_FINGERPRINTS: dict[tuple, list[list]] = {}


def checkpoint_fingerprint(folder: Path) -> list[list] | None:
    """[name, size, content hash] of every file in the checkpoint folder; None when it is not a folder.

    Remembered in this process while no file's size or modification time changes: a probe keys its
    token reference and each eval task's reference by it, and hashes a large checkpoint once."""
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    stamp = (str(folder.resolve()), *((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if stamp not in _FINGERPRINTS:
        _FINGERPRINTS[stamp] = [[str(p.relative_to(folder)), p.stat().st_size, _file_digest(p)] for p in files]
    return _FINGERPRINTS[stamp]


def reference_key(plan: ProbePlan) -> str | None:
    """The cache key of this plan's reference run, or None when it cannot be keyed (a Hub id)."""
    import torch
    import transformers

    from assay.compat.probe import recipe

    checkpoint = checkpoint_fingerprint(Path(plan.ref.load_path))
    if checkpoint is None:
        return None
    document = {
        "format": FORMAT,
        "checkpoint": checkpoint,
        "recipe": hashlib.sha256(Path(recipe.__file__).read_bytes()).hexdigest(),
        "task": plan.task,
        "dtype": plan.request.dtype,
        "new_tokens": plan.request.new_tokens,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if plan.request.reference_dtype not in (None, plan.request.dtype):  # only then: older keys stay valid
        document["reference_dtype"] = plan.request.reference_dtype
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def eval_reference_key(plan: ProbePlan, task_sha256: str, reference_dtype: str) -> str | None:
    """The cache key of one eval task's CPU eager reference, or None when it cannot be keyed (a Hub id)."""
    import lm_eval
    import torch
    import transformers

    from assay.compat.eval import recipe as eval_recipe

    checkpoint = checkpoint_fingerprint(Path(plan.ref.load_path))
    if checkpoint is None:
        return None
    document = {
        "format": EVAL_FORMAT,
        "checkpoint": checkpoint,
        "task": task_sha256,
        "recipe": hashlib.sha256(Path(eval_recipe.__file__).read_bytes()).hexdigest(),
        "model_task": plan.task,
        "dtype": reference_dtype,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "lm_eval": getattr(lm_eval, "__version__", "unknown"),
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def _checksum(tokens: list[int], top5: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps([tokens, top5]).encode()).hexdigest()


class ReferenceCache:
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def load(self, key: str, new_tokens: int) -> tuple[list[int], list[list[int]]] | None:
        """The stored (tokens, top-5 per step), or None for a miss or an entry that is not whole."""
        try:
            entry = json.loads(self.path(key).read_text())
            tokens, top5 = entry["tokens"], entry["top5"]
            whole = (
                entry["format"] == FORMAT and entry["key"] == key and entry["checksum"] == _checksum(tokens, top5)
                and len(tokens) == new_tokens and len(top5) == new_tokens
                and all(isinstance(t, int) for t in tokens)
                and all(len(step) == TOP_K and all(isinstance(t, int) for t in step) for step in top5)
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return (tokens, top5) if whole else None

    def logits_path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.logits.pt"

    def load_logits(self, key: str, new_tokens: int):
        """The reference's raw logits [new_tokens, vocab] (schema 4's drift), or None when absent or not whole."""
        import torch

        try:
            logits = torch.load(self.logits_path(key), weights_only=True)
        except Exception:  # noqa: BLE001  (missing, truncated or foreign: a miss, the probe rewrites it)
            return None
        return logits if isinstance(logits, torch.Tensor) and logits.dim() == 2 and logits.shape[0] == new_tokens else None

    def store_logits(self, key: str, logits) -> None:
        import torch

        from assay.core.files import atomic_path

        self.logits_path(key).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.logits_path(key)) as tmp:
            torch.save(logits.detach().cpu().clone(), tmp)

    def store(self, key: str, tokens: list[int], top5: list[list[int]], model: str) -> None:
        entry = {"format": FORMAT, "key": key, "model": model, "tokens": tokens, "top5": top5, "checksum": _checksum(tokens, top5)}
        atomic_write_json(self.path(key), entry)

    def eval_path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.eval.json"

    def load_eval(self, key: str) -> dict | None:
        """A stored task score (eval_recipe.score's dict), or None for a miss or an entry that is not whole."""
        try:
            entry = json.loads(self.eval_path(key).read_text())
            scores = entry["scores"]
            whole = (entry["format"] == EVAL_FORMAT and entry["key"] == key and entry["checksum"] == _eval_checksum(scores)
                     and isinstance(scores["items"], list) and scores["items"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return scores if whole else None

    def store_eval(self, key: str, scores: dict, model: str) -> None:
        entry = {"format": EVAL_FORMAT, "key": key, "model": model, "scores": scores, "checksum": _eval_checksum(scores)}
        atomic_write_json(self.eval_path(key), entry)


def _eval_checksum(scores: dict) -> str:
    return hashlib.sha256(json.dumps(scores, sort_keys=True).encode()).hexdigest()
