"""Custom operators in plain PyTorch and their references (gla.py: gated linear attention).

Public callers import them through `assay.ops`; this package holds the implementations.
"""
