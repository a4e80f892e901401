"""The layers and roots every native model builds from, one module per concern (assay.models.layers
re-exports their public names)."""
