"""The probe's eval recipe: score lm-eval tasks with the probe's own model object, item by item.

Copied verbatim into a row's run.py when the probe ran with --eval, so it imports nothing but torch,
transformers (through lm_eval) and lm_eval, and lm_eval only inside the functions that need it: what
the probe scored is what a user re-scores.

The model goes to lm-eval's HF model class as the object the probe loaded (on its device, in its dtype),
with its forward compiled by the probe's backend: the device and the compiler under test are the
probe's, not lm-eval's defaults. lm-eval batches requests of every length; each distinct shape would be
a graph of its own, so every forward here runs at a fixed batch size and a length padded up to a power
of two (at least MIN_LENGTH): a handful of shapes, each compiled once. Padding goes on the right, after
every real token, where a causal model's outputs at the real positions cannot see it.
"""

import hashlib
import json
import time

import torch

BATCH_SIZE = 8
# 64, not 32: one compiled graph fewer per task (a full-model compile; minutes on a device compiler), and
# few items are that short (the embedded tasks: about 30 of 200 under 32 tokens), so little padding is added.
MIN_LENGTH = 64


def padded_length(length, limit):
    """The smallest power of two >= length and >= MIN_LENGTH, but at most `limit` (the model's positions)."""
    padded = MIN_LENGTH
    while padded < length:
        padded *= 2
    return max(min(padded, limit), length)


class FixedShapeForward:
    """input_ids [B, T] -> logits [B, T, vocab] through `forward` at [BATCH_SIZE, padded_length(T)] only.

    forward: the model itself (eager) or torch.compile of it; called as forward(input_ids=...).
    """

    def __init__(self, forward, max_length, batch_size=BATCH_SIZE):
        self.forward, self.max_length, self.batch_size = forward, max_length, batch_size
        self.shapes = set()  # the padded shapes run: each one a compiled graph

    def __call__(self, input_ids):  # input_ids: [B, T], B <= batch_size
        batch, length = input_ids.shape
        shape = (max(batch, self.batch_size), padded_length(length, self.max_length))
        self.shapes.add(shape)
        padded = input_ids.new_zeros(shape)
        padded[:batch, :length] = input_ids
        with torch.no_grad():
            logits = self.forward(input_ids=padded).logits
        return logits[:batch, :length]


def compiled_forward(model, backend):
    """torch.compile of the model's forward with the probe's backend, static shapes (FixedShapeForward
    gives it a few): a vendor compiler that needs static shapes sees the same kind of graph as here.

    Dynamo forgets what it compiled before (the generation's decode step): the model's forward is
    compiled afresh for the eval's shapes, and older entries would count against its recompile limit."""
    torch._dynamo.reset()
    return torch.compile(model, backend=backend, dynamic=False)


def make_lm(model, tokenizer, forward):
    """lm-eval's HFLM over the probe's model object; every forward through `forward` (a FixedShapeForward).

    Log-softmax in float32 whatever the model's dtype: the comparison is of what the model computed, not of
    the rounding of lm-eval's scoring of it.
    """
    from lm_eval.models.huggingface import HFLM

    class ProbeLM(HFLM):
        on_progress = None  # (requests scored, requests in all): the probe's own progress report, set per task
        requests_done, requests_total = 0, 1  # counted per loglikelihood call

        def _model_call(self, inps, attn_mask=None, labels=None):
            logits = forward(inps)
            self.requests_done += inps.shape[0]
            if self.on_progress is not None:
                self.on_progress(min(self.requests_done, self.requests_total), self.requests_total)
            return logits

        def loglikelihood(self, requests, disable_tqdm=False):  # no progress bar per task: the probe reports its own phases
            self.requests_done, self.requests_total = 0, max(len(requests), 1)
            return super().loglikelihood(requests, disable_tqdm=True)

    return ProbeLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=forward.batch_size,
                   max_length=forward.max_length, softmax_dtype=torch.float32)


def load_task(path):
    """An lm-eval task from its YAML file (one task, by path: no index of lm-eval's own tasks is built)."""
    from lm_eval.tasks import TaskManager

    loaded = TaskManager(include_defaults=False).load([str(path)])
    if len(loaded["tasks"]) != 1:
        raise ValueError(f"{path} defines {len(loaded['tasks'])} tasks; --eval takes a file with one task")
    return loaded


def task_name(loaded):
    return next(iter(loaded["tasks"]))


def task_content_sha256(loaded, limit=None):
    """What the model is asked: the task's configuration and every document it scores (the first `limit`
    with a limit), hashed."""
    task = next(iter(loaded["tasks"].values()))
    config = json.dumps(task.dump_config(), sort_keys=True, default=str)
    documents = json.dumps(list(task.eval_docs)[:limit], sort_keys=True, default=str)
    return hashlib.sha256((config + "\n" + documents).encode()).hexdigest()


def score(lm, loaded, progress=None, limit=None):
    """Run one loaded task (its first `limit` documents, lm-eval's --limit; None: all); its items in
    document order, each {"doc", "logliks", "chosen", "correct"}.

    logliks: the log-likelihood of each choice (a cloze: of its one target). chosen: the index of the
    most likely choice, or for a cloze 1 when the target is the model's greedy continuation, else 0.
    correct: chosen is the task's answer (acc). progress: called (task, items done, items in all) as the
    forwards run, items estimated from the requests scored (a document asks one per choice).
    """
    from lm_eval.evaluator import evaluate

    name = task_name(loaded)
    documents = len(next(iter(loaded["tasks"].values())).eval_docs)
    documents = documents if limit is None else min(documents, limit)
    if progress is not None:
        lm.on_progress = lambda done, total: progress(name, done * documents // total, documents)
    start = time.perf_counter()
    results = evaluate(lm, loaded, limit=limit, log_samples=True, bootstrap_iters=0)
    lm.on_progress = None
    if progress is not None:
        progress(name, documents, documents)
    seconds = time.perf_counter() - start
    if results is None:  # a rank other than 0 of a sharded run: it ran the same forwards, rank 0 records
        return None
    items = []
    for sample in sorted(results["samples"][name], key=lambda s: s["doc_id"]):
        responses = sample["filtered_resps"]
        logliks = [float(r[0]) for r in responses]
        if len(responses) == 1:  # loglikelihood (a cloze): the answer is whether the target is greedy
            chosen = int(bool(responses[0][1]))
            correct = bool(responses[0][1])
        else:  # multiple choice: the most likely choice, lm-eval's acc
            chosen = max(range(len(logliks)), key=logliks.__getitem__)
            correct = bool(sample.get("acc"))
        items.append({"doc": int(sample["doc_id"]), "logliks": logliks, "chosen": chosen, "correct": correct})
    accuracy = sum(item["correct"] for item in items) / len(items) if items else None
    return {"task": name, "items": items, "accuracy": accuracy, "seconds": seconds}


def model_max_length(model, default=2048):
    """The positions the model takes (its text config's), else lm-eval's own default."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    return default


def score_tasks(model, tokenizer_path, task_paths, forward=None, progress=None, limit=None):
    """Each task of `task_paths` scored with `model`: a list of score()'s dicts (None on ranks other
    than 0), and the padded shapes that ran. forward: the model compiled (compiled_forward), or None to
    run it eager (the reference). Reaching dynamo's recompile limit is an error, never a silent fall back
    to eager that would score the model without the compiler under test. progress and limit: as score()'s."""
    from transformers import AutoTokenizer

    shaped = FixedShapeForward(forward if forward is not None else model, model_max_length(model))
    lm = make_lm(model, AutoTokenizer.from_pretrained(tokenizer_path), shaped)
    with torch.compiler.config.patch(fail_on_recompile_limit_hit=True):
        scores = [score(lm, load_task(path), progress, limit) for path in task_paths]
    return scores, sorted(shaped.shapes)
