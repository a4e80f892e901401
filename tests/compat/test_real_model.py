"""A real pretrained model, SmolLM2-135M-Instruct from the `real` extra's GGUF file: the conversion, the
probe on it, and the sharded probe's default judge. Each test loads 135M parameters: all are slow, and
all share the session's one conversion (conftest.real_model_dir)."""

import hashlib
import json
import random
import shutil

import pytest
import torch

from assay.compat.probe.judge import SMOLLM2_Q4_1_SHA256, default_judge, judge_text
from assay.compat.probe.execute import probe
from assay.compat.probe.request import ProbeRequest
from assay.compat.results.dataset import query
from assay.compat.run.single import probe_and_record
from assay.compat.eval.task_files import TASKS_DIR
from assay.core.numerics import tolerance
from assay.zoo.corpus import corpus_split
from assay.zoo.real import smollm2_gguf_path, source_record

pytestmark = pytest.mark.slow


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_converted_folder_is_a_plain_checkpoint_with_tied_embeddings_that_knows_paris(real_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((real_model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    record = source_record(real_model_dir)
    assert record["sha256"] == _sha256(smollm2_gguf_path()) == SMOLLM2_Q4_1_SHA256
    model = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied on reload
    assert sum(p.numel() for p in model.parameters()) == record["parameters"] == 134_515_008
    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    prompt = tokenizer("The capital of France is", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=3, do_sample=False)
    assert tokenizer.decode(generated[0, prompt["input_ids"].shape[1]:]).startswith(" Paris")


def test_zoo_real_writes_the_same_folder_again_with_progress_and_a_summary(real_model_dir, tmp_path, assay_cli):
    result = assay_cli("zoo", "real", str(tmp_path / "smollm2"))
    assert result.returncode == 0, result.stderr[-2000:]
    for shown in ("LlamaForCausalLM", "134,515,008", SMOLLM2_Q4_1_SHA256, "seconds"):
        assert shown in result.stdout, result.stdout
    assert "5/5" in result.stderr and "de-quantizing" not in result.stderr  # our bar, not Transformers' tqdm
    # The conversion is deterministic: the same bytes as the session's folder.
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert _sha256(tmp_path / "smollm2" / name) == _sha256(real_model_dir / name), name


# The embedded tasks' first items that fit in 64 tokens: every item costs a compiled and an eager forward of 135M
# parameters, and each padded length one more full-model compile (the eval pads to 64, 128, ...; a longer item
# would add a second graph of about 20 CPU-seconds). The README's tour scores 20 cloze passages with
# aot_eager (one answer per item, the same claim). The copies run as a user's own tasks.
EVAL_ITEMS = 12
EVAL_TOKENS = 64


def _fits(item: dict, tokenizer) -> bool:
    """The item's longest request (its context and longest answer, as lm-eval joins them) is at most EVAL_TOKENS."""
    answers = item["choices"] if "choices" in item else [item["target"]]
    return max(len(tokenizer(item["context"] + " " + answer)["input_ids"]) for answer in answers) <= EVAL_TOKENS


def _task_heads(folder, tokenizer) -> tuple[str, ...]:
    shutil.copy(TASKS_DIR / "data.py", folder / "data.py")
    paths = []
    for name in ("assay_cloze", "assay_next_sentence"):
        items = (TASKS_DIR / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
        lines = [line for line in items if _fits(json.loads(line), tokenizer)][:EVAL_ITEMS]
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        spec = (TASKS_DIR / f"{name}.yaml").read_text(encoding="utf-8")
        (folder / f"{name}_head.yaml").write_text(spec.replace(f"task: {name}\n", f"task: {name}_head\n"), encoding="utf-8")
        paths.append(str(folder / f"{name}_head.yaml"))
    return tuple(paths)


@pytest.mark.inductor
def test_converted_model_passes_the_probe_under_inductor_and_scores_the_tasks_as_the_reference(real_model_dir, tmp_path):
    from transformers import AutoTokenizer

    # The suite's one inductor probe: recorded as the matrix records it (probe_and_record), on the real model.
    request = ProbeRequest(str(real_model_dir), backend="inductor", new_tokens=8, reference_cache=None,
                           eval_tasks=_task_heads(tmp_path, AutoTokenizer.from_pretrained(real_model_dir)))
    row = probe_and_record(request, tmp_path / "results")
    assert row["task"] == "text-generation" and row["architecture"] == "LlamaForCausalLM"
    assert row["status"] == "PASS", (row["reason"], row["error"])
    assert row["graphs"] >= 1 and row["graph_breaks"] == 0
    assert row["compile_cache_hit"] is not None  # inductor keeps an FX-graph cache: a lookup was made
    [stored] = query(tmp_path / "results")
    assert stored["stack_id"].startswith("cpu-inductor-") and stored["status"] == "PASS"
    # --eval: the compiled model answers every item scored as the CPU eager reference does.
    assert row["eval_status"] == "AGREE", (row["eval_reason"], row["eval_error"])
    assert row["eval_agreement"] == [1.0, 1.0] and row["eval_disagreements"] == []
    assert row["eval_accuracy"] == row["eval_reference_accuracy"] and row["eval_items"] == [EVAL_ITEMS, EVAL_ITEMS]
    assert row["eval_accuracy"][0] > 0.5 and row["eval_accuracy"][1] > 0.4  # a real model: far above chance (0.25)
    # Log-likelihoods of these items are at most 150 nats (the reference's largest: 149.2, a whole candidate sentence): the
    # compiled-vs-eager float32 tolerance of them. Measured: 1.1e-5 and 6.9e-5 nats (README).
    assert max(row["eval_loglik_max_diff"]) <= tolerance("compiled_vs_eager", torch.float32) * 150, row["eval_loglik_max_diff"]
    assert 1 <= row["eval_graphs"] <= 3 and row["eval_recompiles"] == row["eval_graphs"] - 1


# ------------------------------------------------------------------ the judge


@pytest.fixture(scope="module")
def judge(real_model_dir):
    assert default_judge() == str(real_model_dir)  # the converted folder in the user cache, no second conversion
    return str(real_model_dir)


def _prose_paragraphs(count: int) -> list[str]:
    _, held_out = corpus_split()
    return [" ".join(p.split()) for p in held_out.split("\n\n") if len(p) > 400 and not p.startswith(" ")][:count]


@pytest.mark.parametrize("tokens", [32, 128])  # 32: what a default sharded probe generates, the judge's hardest case
def test_real_judge_finds_prose_fluent_and_shuffled_or_random_tokens_not(judge, tokens):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(judge)
    rng = random.Random(tokens)
    for paragraph in _prose_paragraphs(3):
        ids = tokenizer(paragraph)["input_ids"][:tokens]
        prose = judge_text(tokenizer.decode(ids), judge)
        assert prose.fluent, prose.reason
        shuffled = ids[:]
        rng.shuffle(shuffled)
        verdict = judge_text(tokenizer.decode(shuffled), judge)
        assert not verdict.fluent and "loss" in verdict.reason, verdict.reason
        noise = judge_text(tokenizer.decode([rng.randrange(tokenizer.vocab_size) for _ in ids]), judge)
        assert not noise.fluent and "loss" in noise.reason, noise.reason


@pytest.mark.distributed
def test_sharded_probe_without_reference_or_judge_is_judged_by_the_real_model(zoo_dir, judge):
    row = probe(ProbeRequest(str(zoo_dir / "qwen3"), backend="aot_eager", new_tokens=12, devices=2, reference=False))
    # A random-weights model does not write English: the real judge must say so.
    assert row["check"] == "judge" and f"--judge {judge}" in row["command"]
    assert row["status"] == "FAIL_ACCURACY" and "judge: not fluent" in row["reason"], row["reason"]
