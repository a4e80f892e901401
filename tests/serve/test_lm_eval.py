"""lm-evaluation-harness against `assay serve`: its local-completions client scores a multiple-choice
(log-likelihood) task and a generate_until task of the test's own (local JSONL and lm-eval YAML, no Hub),
and gets the same accuracy, per item, as `lm_eval --model hf` on the same folder in float32.

The model is the tiny zoo Qwen3 (Transformers loads it natively). The server runs eager and float32, so
its log-likelihoods are a float32 computation of the same function as Transformers' forward: per item
they agree within the float32 model-logits tolerance, and the choices they rank are the same.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from assay.core.numerics import tolerance

pytestmark = pytest.mark.slow  # two lm_eval processes (about 25 s each, mostly imports) and a server

MODEL = "qwen3-pretrained"
WORDS = ["river", "stone", "bright", "seven", "window", "garden", "quietly", "north", "paper", "orange", "silver", "market"]


def _write_tasks(folder: Path, model_dir: Path) -> None:
    """A 24-item multiple-choice task and a 12-item generate_until task. Half of the generation targets are
    the model's own greedy continuation (from Transformers' generate), so accuracy is neither 0 nor 1 and
    an engine that generated differently would change it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rng = random.Random(0)
    mc = []
    for i in range(24):
        words = rng.sample(WORDS, 6)
        mc.append({"question": f"{' '.join(words[:3]).capitalize()} and", "choices": [f" {w}" for w in words[3:]], "answer": i % 3})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = []
    for i in range(12):
        prompt = f"{' '.join(rng.sample(WORDS, 4)).capitalize()}:"
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        continuation = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).split("\n")[0]
        gen.append({"question": prompt, "answer": continuation if i % 2 == 0 else continuation + " x"})
    (folder / "mc.jsonl").write_text("".join(json.dumps(row) + "\n" for row in mc))
    (folder / "gen.jsonl").write_text("".join(json.dumps(row) + "\n" for row in gen))
    (folder / "assay_mc.yaml").write_text(f"""task: assay_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / 'mc.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
""")
    (folder / "assay_gen.yaml").write_text(f"""task: assay_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / 'gen.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
""")


def _lm_eval(model: str, model_args: str, tasks: Path, out: Path) -> dict:
    env = os.environ.copy() | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    completed = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks", "assay_mc,assay_gen",
         "--include_path", str(tasks), "--batch_size", "1", "--log_samples", "--output_path", str(out), "--seed", "0"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    samples = {}
    for task in ("assay_mc", "assay_gen"):
        rows = [json.loads(line) for line in next(out.rglob(f"samples_{task}_*.jsonl")).read_text().splitlines()]
        samples[task] = {row["doc_id"]: row for row in rows}
    return {"results": results["results"], "samples": samples}


@pytest.fixture(scope="module")
def server(zoo_dir):
    process = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--model", str(zoo_dir / MODEL), "--port", "0", "--eager",
         "--max-seqs", "4", "--max-len", "512"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
    )
    try:
        line = process.stdout.readline()
        assert "http://" in line, (line, process.stderr.read() if process.poll() is not None else "")
        yield line.rsplit(" ", 1)[-1].strip()
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_lm_eval_through_assay_serve_scores_as_lm_eval_on_transformers(zoo_dir, server, tmp_path):
    model_dir = zoo_dir / MODEL
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _write_tasks(tasks, model_dir)
    served = _lm_eval("local-completions", f"model={MODEL},base_url={server}/v1/completions,tokenizer={model_dir},tokenized_requests=True",
                      tasks, tmp_path / "served")
    reference = _lm_eval("hf", f"pretrained={model_dir},dtype=float32", tasks, tmp_path / "hf")

    for task, metric in (("assay_mc", "acc,none"), ("assay_gen", "exact_match,none")):
        print(f"{task}: served {served['results'][task][metric]}, hf {reference['results'][task][metric]}")
        assert served["results"][task][metric] == reference["results"][task][metric], task
    assert 0 < reference["results"]["assay_gen"]["exact_match,none"] < 1  # the task can tell engines apart

    # Per item: each choice's log-likelihood (float32, the same function) and its is-greedy flag.
    tol = tolerance("model_logits", torch.float32)
    for doc_id, row in reference["samples"]["assay_mc"].items():
        mine = served["samples"]["assay_mc"][doc_id]
        want = torch.tensor([float(r[0]) for r in row["filtered_resps"]], dtype=torch.float64)
        got = torch.tensor([float(r[0]) for r in mine["filtered_resps"]], dtype=torch.float64)
        assert ((got - want).norm() / want.norm()).item() <= tol, (doc_id, got, want)
        assert [r[1] for r in mine["filtered_resps"]] == [r[1] for r in row["filtered_resps"]]
    for doc_id, row in reference["samples"]["assay_gen"].items():
        assert served["samples"]["assay_gen"][doc_id]["filtered_resps"] == row["filtered_resps"], doc_id
