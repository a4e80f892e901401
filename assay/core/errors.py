"""The one exception type for user-facing failures: the CLI prints its message on one line and exits 2."""


class AssayError(Exception):
    """Bad usage or input (a path that is not a checkpoint, an unknown device, ...).

    Anything else raised inside assay is a bug and keeps its traceback.
    """
