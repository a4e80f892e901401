"""Render the self-contained run.py that reproduces one probe result.

It is the recipe module's source, verbatim, plus a main block with this result's arguments: it needs
only torch and transformers (and PIL for image models), never assay.
"""

from __future__ import annotations

import inspect

from assay.compat import recipe


def render_run_py(
    *, model_path: str, task: str, device: str, dtype: str, backend: str, new_tokens: int, stack_label: str, stack_id: str,
    parallelism: str = "single", num_devices: int = 1, model_code: str | None = None,
) -> str:
    """model_code: a module to import before loading (it registers a model_type Transformers lacks)."""
    recipe_source = inspect.getsource(recipe)
    header = (
        f'"""Reproduce an assay probe: greedy generation of {new_tokens} tokens with a static cache under\n'
        f"torch.compile(backend={backend!r}) on {device}, {dtype}. Prints the generated token ids as JSON.\n\n"
        f"Recorded on stack {stack_id}:\n  {stack_label}\n"
        + (f"Requires: torch, transformers and {model_code} (its import registers the model with Transformers)"
           if model_code else "Requires: torch, transformers (and pillow for image-text models)")
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
    return tokens


if __name__ == "__main__":
    import json

    # Sharded: this script starts its own torch.distributed processes (no torchrun needed).
    tokens = run() if NUM_DEVICES == 1 else launch(run, NUM_DEVICES, DEVICE.split(":")[0])
    print(json.dumps({{"model": MODEL, "tokens": tokens}}))
'''
    body = recipe_source.split('"""', 2)[2].lstrip("\n")  # drop the module docstring, keep the code
    return header + "\n" + body.rstrip() + "\n" + main
