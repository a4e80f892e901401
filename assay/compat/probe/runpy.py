"""Render the self-contained run.py that reproduces one probe result.

It is the recipe module's source, verbatim, plus a main block with this result's arguments: it needs
only torch and transformers (and PIL for image models), never assay.
"""

from __future__ import annotations

import inspect

from assay.compat.eval import recipe as eval_recipe
from assay.compat.probe import recipe


def render_run_py(
    *, model_path: str, task: str, device: str, dtype: str, backend: str, new_tokens: int, stack_label: str, stack_id: str,
    parallelism: str = "single", num_devices: int = 1, model_code: str | None = None, eval_tasks: tuple[str, ...] = (),
    eval_limit: int | None = None,
) -> str:
    """model_code: a module to import before loading (it registers a model_type Transformers lacks).
    eval_tasks: the probe's --eval tasks (embedded names or YAML paths): run.py scores them too, with
    eval/recipe.py's source and the embedded tasks' files inside it; eval_limit: their first documents only."""
    recipe_source = inspect.getsource(recipe)
    header = (
        f'"""Reproduce an assay probe: greedy generation of {new_tokens} tokens with a static cache under\n'
        f"torch.compile(backend={backend!r}) on {device}, {dtype}. Prints the generated token ids as JSON.\n\n"
        f"Recorded on stack {stack_id}:\n  {stack_label}\n"
        + (f"Requires: torch, transformers and {model_code} (its import registers the model with Transformers)"
           if model_code else "Requires: torch, transformers (and pillow for image-text models)")
        + (", and lm-eval for the eval" if eval_tasks else "")
        + '."""\n'
    )
    import_model_code = f"import {model_code}  # registers the model's config and class with Transformers' Auto classes\n" if model_code else ""
    main = f'''

{import_model_code}MODEL = {model_path!r}
TASK = {task!r}
DEVICE = {device!r}
DTYPE = {dtype!r}
BACKEND = {backend!r}
NEW_TOKENS = {new_tokens}
PARALLELISM = {parallelism!r}  # "single", or how the model is sharded over NUM_DEVICES processes
NUM_DEVICES = {num_devices}


def run():
    device = DEVICE
    if NUM_DEVICES > 1 and DEVICE.split(":")[0] != "cpu":
        device = DEVICE.split(":")[0] + ":" + os.environ["LOCAL_RANK"]
    model = load_model(MODEL, TASK, device, DTYPE, PARALLELISM, NUM_DEVICES)
    inputs = make_inputs(MODEL, TASK, device)
    tokens, _ = generate(model, inputs, NEW_TOKENS, compile_config(BACKEND))
    __RESULT__


if __name__ == "__main__":
    # Sharded: this script starts its own torch.distributed processes (no torchrun needed).
    result = run() if NUM_DEVICES == 1 else launch(run, NUM_DEVICES, DEVICE.split(":")[0])
    print(json.dumps({{"model": MODEL, **result}}))
'''
    body = _code(recipe_source)
    if eval_tasks:
        body += "\n\n\n# ---- the eval (assay/compat/eval/recipe.py, verbatim)\n\n" + _code(inspect.getsource(eval_recipe))
        main = main.replace("    __RESULT__", EVAL_CALL).replace("\n\nif __name__", _eval_block(eval_tasks, eval_limit) + "\n\nif __name__", 1)
    else:
        main = main.replace("__RESULT__", 'return {"tokens": tokens}')
    return header + "\n" + body.rstrip() + "\n" + main


def _code(source: str) -> str:
    """A module's source without its docstring (and without imports run.py already has at its top)."""
    return source.split('"""', 2)[2].lstrip("\n").rstrip()


# run() with --eval: the tasks scored with the model compiled by BACKEND, after the generation, as the probe did.
EVAL_CALL = """\
    scores, _ = score_tasks(model, MODEL, eval_task_files(), compiled_forward(model, BACKEND), limit=EVAL_LIMIT)
    if scores[0] is None:  # a rank other than 0: it ran the same forwards, rank 0 reports
        return {}
    return {"tokens": tokens, "eval": {s["task"]: {"accuracy": s["accuracy"], "chosen": [i["chosen"] for i in s["items"]]} for s in scores}}"""


def _eval_block(eval_tasks: tuple[str, ...], eval_limit: int | None) -> str:
    from assay.compat.eval.task_files import EMBEDDED, embedded_files, pack_files

    files = [f"{spec}.yaml" if spec in EMBEDDED else spec for spec in eval_tasks]
    return f'''
# The --eval tasks: the embedded ones' files (YAML, items, loader) packed below, or the user's own YAML by path.
EVAL_TASKS = {files!r}
EVAL_LIMIT = {eval_limit!r}  # each task's first documents only (the probe's --eval-limit); None: all
EVAL_FILES = """
{pack_files(embedded_files(eval_tasks))}
"""


def eval_task_files():
    import atexit
    import base64
    import shutil
    import tempfile
    import zlib

    folder = tempfile.mkdtemp(prefix="assay-eval-tasks-")
    atexit.register(shutil.rmtree, folder, True)  # the task files are this run's only
    for name, text in json.loads(zlib.decompress(base64.b64decode("".join(EVAL_FILES.split())))).items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
            handle.write(text)
    return [os.path.join(folder, name) for name in EVAL_TASKS]  # an absolute path stays itself
'''
