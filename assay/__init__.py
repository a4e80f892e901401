"""assay: bring language models up on a PyTorch device stack and prove what works there."""

from assay.core.errors import AssayError
from assay.models import auto as _auto

# Transformers' Auto classes learn model_type "gla" (lazily: nothing heavy is imported here).
_auto.install()

__version__ = "0.1.0"
__all__ = ["AssayError", "__version__"]
