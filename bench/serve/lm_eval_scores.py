"""lm-evaluation-harness against `assay serve` next to lm-eval on Transformers, on the same checkpoint.

    python bench/serve/lm_eval_scores.py [--model DIR] [--quantize int8]     -> bench/results/serve_lm_eval.json

Two local tasks (bench/serve/lm_eval_tasks/: 40 four-way multiple-choice questions, scored by log-likelihood;
20 sentences to complete with one word, generate_until ".", "," or a newline, exact match ignoring case
and punctuation), written as lm-eval YAML into a temporary folder and run twice, both float32 on the CPU:

    lm_eval --model local-completions --model_args base_url=URL/v1/completions,tokenizer=DIR,tokenized_requests=True ...
    lm_eval --model hf --model_args pretrained=DIR,dtype=float32 ...

against `assay serve --model DIR --eager` (a real process on loopback). It records each task's accuracy
both ways, the items where they differ, the largest relative difference of a choice's log-likelihood, and
the wall time of each run. Default model: the real SmolLM2-135M-Instruct (`assay zoo real`).

--quantize int8 serves the model a second time with `--quantize int8` and scores it the same way: its
accuracy beside float32's (served and Transformers'), in the JSON's "quantized" entry.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `bench.*` and this checkout's `assay`

import argparse
import json
import os
import subprocess
import tempfile
import time

from assay.core.files import atomic_write_json
from assay.serve.runner.dtypes import QUANTIZATIONS
from bench.common import RESULTS

TASKS = Path(__file__).resolve().parent / "lm_eval_tasks"

CHOICE_YAML = """task: assay_qa_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: " "
metric_list:
  - metric: acc
"""
ANSWER_YAML = """task: assay_qa_answer
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: " {{{{answer}}}}"
generation_kwargs:
  until: [".", ",", "\\n"]
  max_gen_toks: 8
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
"""


def write_tasks(folder: Path) -> str:
    (folder / "assay_qa_choice.yaml").write_text(CHOICE_YAML.format(data=TASKS / "qa_choice.jsonl"))
    (folder / "assay_qa_answer.yaml").write_text(ANSWER_YAML.format(data=TASKS / "qa_answer.jsonl"))
    return "assay_qa_choice,assay_qa_answer"


def run_lm_eval(model: str, model_args: str, tasks: str, include: Path, out: Path) -> dict:
    command = [sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks", tasks, "--include_path",
               str(include), "--batch_size", "1", "--log_samples", "--output_path", str(out), "--seed", "0"]
    env = os.environ.copy() | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    wall_s = time.perf_counter() - start
    if completed.returncode != 0:
        raise SystemExit(f"lm_eval --model {model} failed:\n{completed.stderr[-3000:]}")
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    samples = {}
    for task in tasks.split(","):
        rows = [json.loads(line) for line in next(out.rglob(f"samples_{task}_*.jsonl")).read_text().splitlines()]
        samples[task] = {row["doc_id"]: row for row in rows}
    return {"command": " ".join(command[2:]), "wall_s": round(wall_s, 1), "results": results, "samples": samples}


def run_served(model: Path, tasks: str, include: Path, out: Path, *serve_flags: str) -> dict:
    """lm_eval's local-completions client against `assay serve --eager` (a real process on loopback)."""
    server = subprocess.Popen([sys.executable, "-m", "assay", "serve", "--model", str(model), "--port", "0", "--eager",
                               "--max-seqs", "4", "--max-len", "2048", *serve_flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        if "http://" not in line:
            raise SystemExit(f"assay serve did not start: {line} {server.stderr.read()}")
        url = line.rsplit(" ", 1)[-1].strip()
        return run_lm_eval("local-completions", f"model={model.name},base_url={url}/v1/completions,tokenizer={model},"
                           "tokenized_requests=True", tasks, include, out)
    finally:
        server.terminate()
        server.wait(60)


def compare(served: dict, reference: dict) -> dict:
    rows = {}
    for task, metric in (("assay_qa_choice", "acc,none"), ("assay_qa_answer", "exact_match,none")):
        mine, theirs = served["samples"][task], reference["samples"][task]
        differing = [doc for doc in theirs if mine[doc]["filtered_resps"] != theirs[doc]["filtered_resps"]]
        row = {"served": served["results"][task][metric], "transformers": reference["results"][task][metric], "items": len(theirs),
               "items_scored_differently": sum(mine[d][metric.split(",")[0]] != theirs[d][metric.split(",")[0]] for d in theirs)}
        if task == "assay_qa_choice":
            worst = 0.0
            for doc in theirs:
                for a, b in zip(mine[doc]["filtered_resps"], theirs[doc]["filtered_resps"]):
                    worst = max(worst, abs(float(a[0]) - float(b[0])) / max(abs(float(b[0])), 1e-12))
            row["max_rel_diff_loglikelihood"] = worst
        else:
            row["generations_differing"] = len(differing)
            row["examples"] = [{"prompt": theirs[d]["doc"]["prompt"], "target": theirs[d]["target"],
                                "served": mine[d]["filtered_resps"][0], "transformers": theirs[d]["filtered_resps"][0]} for d in sorted(theirs)[:6]]
        rows[task] = row
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint folder (default: the real SmolLM2-135M-Instruct)")
    parser.add_argument("--quantize", default=None, choices=QUANTIZATIONS, help="also serve the model with --quantize QUANTIZE and score it")
    parser.add_argument("--out", default=str(RESULTS / "serve_lm_eval.json"))
    args = parser.parse_args()
    if args.model is None:
        from assay.zoo.real import cached_smollm2

        args.model = str(cached_smollm2())
    model = Path(args.model).resolve()
    with tempfile.TemporaryDirectory(prefix="assay-lm-eval-") as tmp:
        tmp_path = Path(tmp)
        tasks = write_tasks(tmp_path)
        served = run_served(model, tasks, tmp_path, tmp_path / "served")
        quantized = run_served(model, tasks, tmp_path, tmp_path / "quantized", "--quantize", args.quantize) if args.quantize else None
        reference = run_lm_eval("hf", f"pretrained={model},dtype=float32", tasks, tmp_path, tmp_path / "hf")
    payload = {
        "model": model.name, "device": "cpu", "dtype": "float32", "tasks": compare(served, reference),
        "served": {"command": served["command"], "wall_s": served["wall_s"]},
        "transformers": {"command": reference["command"], "wall_s": reference["wall_s"]},
    }
    if quantized is not None:  # "served" in these rows is the quantized server; against both float32 runs
        payload["quantized"] = {"quantize": args.quantize, "command": quantized["command"], "wall_s": quantized["wall_s"],
                                "tasks": compare(quantized, reference), "against_float32_served": compare(quantized, served)}
    atomic_write_json(Path(args.out), payload)
    print(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
