"""The CPU eager reference of a probe and the comparison with it: tokens, top-5 ids and raw logits,
from the reference cache (reference_cache.py) or run here; the token verdict and the logit drift."""

from __future__ import annotations

import time

import torch

from assay.compat.probe import recipe
from assay.compat.probe.request import ProbePlan, ProbeRequest
from assay.core.numerics import compare_tokens


def reference_dtype(request: ProbeRequest) -> str:
    return request.reference_dtype or request.dtype


def record_drift(row: dict, plan: ProbePlan, tokens: list[int], logits, reference: tuple) -> None:
    """The logit drift columns (drift.py): the compiled run's logits against the reference's."""
    from assay.compat.probe.drift import compared_steps, logit_drift

    reference_logits = reference[2]
    if logits is None or reference_logits is None:
        return
    steps = compared_steps(tokens, reference[0])
    row.update(logit_drift(logits, reference_logits, steps).row_columns(reference_dtype(plan.request)))


def run_reference(plan: ProbePlan, row: dict, model=None, inputs=None) -> tuple[list[int], list[list[int]], "torch.Tensor"]:
    """The CPU eager reference: (tokens, top-5 token ids per step, logits [steps, vocab]), from the
    reference cache or run here.

    `model`/`inputs`: already loaded on the CPU in the probe's dtype (used unless the reference is
    asked in float64). Fills the row's reference_s and reference_cache_hit (None when no cache was
    consulted: disabled, or a Hub id that cannot be keyed by content).
    """
    start = time.perf_counter()
    dtype = reference_dtype(plan.request)
    cache, key = None, None
    if plan.request.reference_cache is not None:
        from assay.compat.probe.reference_cache import ReferenceCache, default_root, reference_key

        cache = ReferenceCache(default_root() if plan.request.reference_cache == "auto" else plan.request.reference_cache)
        key = reference_key(plan)
    if key is not None:
        cached = cache.load(key, plan.request.new_tokens)
        cached_logits = cache.load_logits(key, plan.request.new_tokens) if cached is not None else None
        # An entry from before logits were kept is a miss: the rerun stores them, and the row gets its drift.
        row["reference_cache_hit"] = cached_logits is not None
        if cached_logits is not None:
            row["reference_s"] = time.perf_counter() - start
            return (*cached, cached_logits)
    if model is None or dtype != plan.request.dtype:
        model = recipe.load_model(plan.ref.load_path, plan.task, "cpu", dtype)
        inputs = recipe.make_inputs(plan.ref.load_path, plan.task, "cpu")
        inputs = {name: value.to(getattr(torch, dtype)) if value.is_floating_point() else value for name, value in inputs.items()}
    tokens, top5, logits = recipe.generate_logits(model, inputs, plan.request.new_tokens, None)
    if key is not None:
        cache.store(key, tokens, top5, plan.ref.name)
        cache.store_logits(key, logits)
    row["reference_s"] = time.perf_counter() - start
    return tokens, top5, logits


def compare_with_reference(row: dict, tokens: list[int], reference: tuple[list[int], list[list[int]]], what: str = "CPU eager") -> tuple[str, str]:
    """The one token comparison: fills the reference and mismatch columns, returns (status, reason)."""
    reference_tokens, top5 = reference[0], reference[1]
    row["reference_tokens"] = reference_tokens
    mismatch = compare_tokens(tokens, reference_tokens, top5)
    if mismatch is None:
        return "PASS", f"{len(tokens)} greedy tokens equal the {what} reference"
    row.update(
        first_mismatch=mismatch.position, mismatch_expected=mismatch.expected, mismatch_actual=mismatch.actual,
        mismatch_in_top5=mismatch.actual_in_reference_top5,
    )
    verdict = "in the reference's top-5 (numerical drift)" if mismatch.actual_in_reference_top5 else "not in the reference's top-5 (garbage)"
    return "FAIL_ACCURACY", f"token {mismatch.position} differs: device {mismatch.actual}, reference {mismatch.expected}; device token {verdict}"


def record_texts(row: dict, load_path: str) -> None:
    """The generated and reference tokens decoded by the checkpoint's tokenizer (special tokens kept: the text
    says what the ids say), beside the ids. A checkpoint whose tokenizer does not load leaves them null."""
    wanted = [key for key in ("generated", "reference") if row.get(f"{key}_tokens")]
    if not wanted:
        return
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(load_path)
    except Exception:  # a damaged or tokenizer-less checkpoint: the ids alone, as before
        return
    for key in wanted:
        row[f"{key}_text"] = tokenizer.decode(row[f"{key}_tokens"], skip_special_tokens=False)
