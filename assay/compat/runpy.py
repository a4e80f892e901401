"""Render the self-contained run.py that reproduces one probe result.

It is the recipe module's source, verbatim, plus a main block with this result's arguments: it needs
only torch and transformers (and PIL for image models), never assay.
"""

from __future__ import annotations

import inspect

from assay.compat import recipe


def render_run_py(*, model_path: str, task: str, device: str, dtype: str, backend: str, new_tokens: int, stack_label: str, stack_id: str) -> str:
    recipe_source = inspect.getsource(recipe)
    header = (
        f'"""Reproduce an assay probe: greedy generation of {new_tokens} tokens with a static cache under\n'
        f"torch.compile(backend={backend!r}) on {device}, {dtype}. Prints the generated token ids as JSON.\n\n"
        f"Recorded on stack {stack_id}:\n  {stack_label}\n"
        'Requires: torch, transformers (and pillow for image-text models)."""\n'
    )
    main = f'''

if __name__ == "__main__":
    import json

    MODEL = {model_path!r}
    TASK = {task!r}
    DEVICE = {device!r}
    DTYPE = {dtype!r}
    BACKEND = {backend!r}
    NEW_TOKENS = {new_tokens}

    model = load_model(MODEL, TASK, DEVICE, DTYPE)
    inputs = make_inputs(MODEL, TASK, DEVICE)
    tokens, _ = generate(model, inputs, NEW_TOKENS, compile_config(BACKEND))
    print(json.dumps({{"model": MODEL, "tokens": tokens}}))
'''
    body = recipe_source.split('"""', 2)[2].lstrip("\n")  # drop the module docstring, keep the code
    return header + "\n" + body.rstrip() + "\n" + main
