"""Tiny real-architecture checkpoints, the embedded corpus and the shared tokenizer."""

from assay.zoo.build import CATALOG_FILE, build_zoo
from assay.zoo.entries import ZOO, ZooEntry

__all__ = ["CATALOG_FILE", "ZOO", "ZooEntry", "build_zoo"]
