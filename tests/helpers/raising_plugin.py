"""A plugin (ASSAY_PLUGINS) whose import raises: the probe worker dies before any probe phase."""

raise ValueError("the model code raised outside any phase")
