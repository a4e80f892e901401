"""Recall under a fixed state: multi-query associative recall (MQAR) trained on matched-size GLA and
attention models, and a needle-in-a-haystack probe for any checkpoint.

    from assay.recall.shapes import MQARLayout
    from assay.recall.mqar import make_batch, evaluate
    from assay.recall.train import RecallTrainRequest, train_recall
    from assay.recall.needle import NeedleRequest, run_needle

Modules import torch on use; `assay --help` loads only commands.py.
"""
