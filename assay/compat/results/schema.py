"""The results dataset's schema: one definition that writers and readers import.

Documented in docs/dataset.md. Bump SCHEMA_VERSION when a column changes meaning or type; readers
accept older files by name (DuckDB's union_by_name) and fill missing columns with null.
"""

from __future__ import annotations

import pyarrow as pa

# Statuses and what they mean. SKIPPED is deliberate and never a failure; "not tested" is not a
# status at all (the model has no row). Defined with the schema: the app reads them without the probe.
STATUSES = {
    "PASS": "generated the tokens the reference generated (or, sharded, the judge found the text fluent)",
    "FAIL_ACCURACY": "ran, but the tokens differ from the reference (first mismatch recorded)",
    "FAIL_LOAD": "from_pretrained failed (missing or corrupt weights, unknown architecture, ...)",
    "FAIL_COMPILE": "torch.compile failed (dynamo or the backend compiler raised)",
    "FAIL_RUN": "compiled, but running the model raised",
    "OOM": "the device or host ran out of memory",
    "TIMEOUT": "killed after the time limit",
    "CRASH": "the probe process died (signal, segfault) without reporting",
    "SKIPPED": "deliberately not run (reason recorded); not a failure",
}
# The eval's verdict (`--eval`, eval/compare.py): a flag beside the status, which stays the token check's.
EVAL_STATUSES = {
    "AGREE": "on every task the device chose the CPU eager reference's answer on at least 95% of items, and its accuracy moved no more than chance allows",
    "DISAGREE": "on some task the device's answers or accuracy differ from the reference's beyond that (the reason names the task)",
    "FAIL": "the eval could not finish (the reason says where)",
}
FAILURES = tuple(s for s in STATUSES if s.startswith("FAIL") or s in ("OOM", "TIMEOUT", "CRASH"))

SCHEMA_VERSION = 7  # 2: cache_kind and model_code; 3: reference cache and per-phase times (reference_cache_hit, reference_s, trace_s, ...);
# 4: failure triage (logit_* drift, compile_reasons, repro_*: docs/triage.md); 5: task accuracy (eval_*: `--eval`);
# 6: the tokens decoded (generated_text, reference_text); 7: eval_limit (`--eval-limit`)

SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int32(), nullable=False),
        # what was probed
        pa.field("model", pa.string(), nullable=False),  # Hub id or the path as given
        pa.field("model_name", pa.string()),  # folder name or Hub id, for search
        pa.field("task", pa.string()),
        pa.field("architecture", pa.string()),
        pa.field("stands_in_for", pa.string()),  # zoo entries: the public checkpoint they reproduce
        # verdict
        pa.field("status", pa.string(), nullable=False),
        pa.field("reason", pa.string()),  # one line: why this status
        pa.field("error", pa.string()),  # full traceback when something raised
        pa.field("check", pa.string()),  # what a PASS compared: "tokens-vs-cpu-eager" or "judge"
        pa.field("first_mismatch", pa.int32()),
        pa.field("mismatch_expected", pa.int64()),
        pa.field("mismatch_actual", pa.int64()),
        pa.field("mismatch_in_top5", pa.bool_()),
        # where and how
        pa.field("device", pa.string(), nullable=False),
        pa.field("device_name", pa.string()),
        pa.field("backend", pa.string(), nullable=False),
        pa.field("dtype", pa.string()),
        pa.field("num_devices", pa.int32()),
        pa.field("parallelism", pa.string()),  # "single", "tensor", "expert"
        pa.field("stack_id", pa.string(), nullable=False),
        pa.field("stack_label", pa.string()),
        pa.field("versions", pa.string()),  # JSON: the whole stack (assay.core.stack.Stack.as_dict)
        pa.field("run_py", pa.string()),  # the self-contained script that reproduces this row
        pa.field("command", pa.string()),  # the one-line assay command that produced it
        pa.field("model_code", pa.string()),  # the module run.py imports for the model (null: Transformers' own)
        pa.field("cache_kind", pa.string()),  # "static_kv" (a static key/value cache) or "fixed_state" (recurrent state)
        # tokens
        pa.field("prompt_tokens", pa.int32()),
        pa.field("new_tokens", pa.int32()),
        pa.field("generated_tokens", pa.list_(pa.int64())),
        pa.field("reference_tokens", pa.list_(pa.int64())),
        pa.field("generated_text", pa.string()),  # generated_tokens decoded by the checkpoint's tokenizer
        pa.field("reference_text", pa.string()),  # reference_tokens decoded the same way
        # timings and memory
        pa.field("load_s", pa.float64()),
        pa.field("compile_s", pa.float64()),  # first compiled generate: compilation + one generation
        pa.field("decode_tokens_per_s", pa.float64()),  # second compiled generate, graphs warm
        pa.field("total_s", pa.float64()),  # wall time of the whole probe, compilation included
        # per-phase times (schema 2): where a probe's wall time goes (docs/dataset.md, "Phases")
        pa.field("reference_s", pa.float64()),  # CPU eager reference, or its reference-cache lookup on a hit
        pa.field("trace_s", pa.float64()),  # dynamo tracing within the first compiled generate
        pa.field("backend_compile_s", pa.float64()),  # the backend compiler (inductor: incl. its cache loads)
        pa.field("first_call_s", pa.float64()),  # compile_s less trace_s and backend_compile_s: running the first call
        pa.field("generate_s", pa.float64()),  # the measured (second) compiled generate
        pa.field("compile_cache_io_s", pa.float64()),  # sweep --cache-dir: loading and saving the portable compile cache
        pa.field("peak_memory_bytes", pa.int64()),
        pa.field("memory_kind", pa.string()),  # "host_rss" on CPU, "<type>_allocated" on devices
        # compilation
        pa.field("graphs", pa.int32()),
        pa.field("graph_breaks", pa.int32()),
        pa.field("recompiles", pa.int32()),
        pa.field("compile_cache_hit", pa.bool_()),
        pa.field("reference_cache_hit", pa.bool_()),  # schema 2: reference from the reference cache; null: no cache consulted
        # triage (schema 4, docs/triage.md). Logit drift vs the reference, per compared step (up to and
        # including the first token mismatch) and its worst value; null where no logits were compared.
        pa.field("logit_max_abs", pa.list_(pa.float64())),
        pa.field("logit_max_rel", pa.list_(pa.float64())),  # max abs diff / max |reference logit|, per step
        pa.field("logit_cosine", pa.list_(pa.float64())),
        pa.field("logit_max_abs_max", pa.float64()),
        pa.field("logit_max_rel_max", pa.float64()),
        pa.field("logit_cosine_min", pa.float64()),
        pa.field("logit_reference_dtype", pa.string()),  # the reference run's dtype: the row's, or float64
        pa.field("compile_reasons", pa.list_(pa.string())),  # dynamo's graph-break and recompile reasons, deduplicated, short
        pa.field("repro_py", pa.string()),  # `assay triage`: torch's minified repro script, standalone
        pa.field("repro_lines", pa.int32()),
        pa.field("repro_verified", pa.bool_()),  # running repro_py on its own reproduced the failure
        pa.field("repro_after", pa.string()),  # the minifier's stage: "dynamo" or "aot"
        pa.field("triage_reason", pa.string()),  # one line: what triage did, or why it has no repro
        pa.field("triage_s", pa.float64()),
        # task accuracy (schema 5, `--eval`; docs/dataset.md "The eval"): one list entry per task, in eval_tasks'
        # order; device = the probe's device, backend and dtype; reference = CPU eager, float32 (or float64).
        pa.field("eval_tasks", pa.list_(pa.string())),  # lm-eval task names
        pa.field("eval_items", pa.list_(pa.int32())),
        pa.field("eval_limit", pa.int32()),  # --eval-limit: each task's first N documents were scored (null: all of them)
        pa.field("eval_accuracy", pa.list_(pa.float64())),  # on the device
        pa.field("eval_reference_accuracy", pa.list_(pa.float64())),
        pa.field("eval_accuracy_diff", pa.list_(pa.float64())),  # device - reference
        pa.field("eval_agreement", pa.list_(pa.float64())),  # share of items whose chosen answer is the reference's
        pa.field("eval_loglik_max_diff", pa.list_(pa.float64())),  # max |log-likelihood difference| over items and choices
        pa.field("eval_seconds", pa.list_(pa.float64())),  # scoring the task on the device (compilation included)
        pa.field("eval_reference_seconds", pa.list_(pa.float64())),  # the reference's, or its cache lookup on a hit
        pa.field("eval_disagreements", pa.list_(pa.string())),  # "task#doc" of each item whose answer changed
        pa.field("eval_agreement_min", pa.float64()),
        pa.field("eval_status", pa.string()),  # AGREE, DISAGREE or FAIL (null: no eval asked, or not run)
        pa.field("eval_reason", pa.string()),  # one line: the verdict's reason, the failure, or why it did not run
        pa.field("eval_error", pa.string()),  # the traceback when the eval failed
        pa.field("eval_graphs", pa.int32()),  # graphs compiled for the eval's forwards (a few padded shapes)
        pa.field("eval_recompiles", pa.int32()),
        pa.field("eval_reference_cache_hit", pa.bool_()),  # every task's reference from the cache; null: no cache consulted
        pa.field("eval_reference_dtype", pa.string()),
        pa.field("eval_s", pa.float64()),  # the whole eval phase, device and reference
        # provenance
        pa.field("started_at", pa.string()),  # ISO 8601, UTC
        pa.field("host", pa.string()),
        pa.field("assay_version", pa.string()),
    ],
    metadata={"assay_schema_version": str(SCHEMA_VERSION)},
)

COLUMNS = [field.name for field in SCHEMA]
# A model has one row per stack and dtype: re-probing replaces it.
ROW_KEY = ("model", "dtype")


def empty_row() -> dict:
    return {name: None for name in COLUMNS} | {"schema_version": SCHEMA_VERSION}

TEXT_TASKS = ("text-generation",)
IMAGE_TASKS = ("image-text-to-text",)
