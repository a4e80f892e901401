"""Tiny real-architecture checkpoints, the embedded corpus and the shared tokenizer."""

from assay.core.lazy import lazy_exports

# Names load on first use: `assay --help` imports assay.zoo.commands without importing torch.
_EXPORTS = {"CATALOG_FILE": "assay.zoo.build", "build_zoo": "assay.zoo.build", "ZOO": "assay.zoo.entries", "ZooEntry": "assay.zoo.entries"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
