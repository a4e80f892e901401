"""assay: bring language models up on a PyTorch device stack and prove what works there."""

from assay.core.errors import AssayError

__version__ = "0.1.0"
__all__ = ["AssayError", "__version__"]
