"""The probe's recipe: load a checkpoint, build its inputs, generate greedily with a static cache.

This module is copied verbatim into every result's run.py, so it imports nothing but torch,
transformers and PIL: what the probe ran is exactly what a user re-runs.
"""

import torch

PROMPT = "The Python language reference describes the syntax and the core semantics of the language. A function"
IMAGE_PROMPT = "Describe this image."
IMAGE_TASK = "image-text-to-text"


def load_model(model_id, task, device, dtype):
    """from_pretrained on the device, in the dtype; Hub ids and local folders take the same path."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if task == IMAGE_TASK else AutoModelForCausalLM
    model = auto.from_pretrained(model_id, dtype=getattr(torch, dtype), device_map=None)
    return model.to(device).eval()


def synthetic_image():
    """A fixed 32x32 RGB gradient: the same pixels on every machine, no file needed."""
    from PIL import Image

    size = 32
    pixels = bytes(
        value
        for y in range(size)
        for x in range(size)
        for value in ((x * 255) // (size - 1), (y * 255) // (size - 1), ((x + y) * 255) // (2 * size - 2))
    )
    return Image.frombytes("RGB", (size, size), pixels)


def make_inputs(model_id, task, device):
    """Tokenised prompt (text models) or processor output for a fixed image and prompt (image-text)."""
    if task == IMAGE_TASK:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(model_id)
        image_marker = getattr(processor, "image_token", None) or getattr(processor, "boi_token", "<image>")
        inputs = processor(images=[synthetic_image()], text=[f"{image_marker} {IMAGE_PROMPT}"], return_tensors="pt")
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_id)
        inputs = tokenizer([PROMPT], return_tensors="pt")
    return {name: value.to(device) for name, value in inputs.items() if hasattr(value, "to")}


def compile_config(backend):
    """How Transformers should compile the decode step: torch.compile(backend=...), default options.

    One object per probe: Transformers keeps its compiled forward while the config stays equal, so the
    second generate reuses the graphs the first one built.
    """
    from transformers import CompileConfig

    config = CompileConfig(backend=backend, mode=None, fullgraph=False, dynamic=False)
    config._compile_all_devices = True  # Transformers compiles only on accelerators unless told
    return config


def generate(model, inputs, new_tokens, config=None, output_scores=False):
    """Greedy generation of exactly `new_tokens` tokens with a static cache; config=None runs eager.

    Static cache: every decode step has the same shapes, so a compiled graph is reused instead of
    recompiled per token (the reference system's condition for compiling at all).
    """
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        cache_implementation="static",
        return_dict_in_generate=True,
        output_scores=output_scores,
    )
    if config is None:
        kwargs["disable_compile"] = True
    else:
        kwargs["compile_config"] = config
    with torch.inference_mode():
        output = model.generate(**inputs, **kwargs)
    prompt_length = inputs["input_ids"].shape[1]
    tokens = output.sequences[0, prompt_length:].tolist()
    top5 = [step_scores[0].float().topk(5).indices.tolist() for step_scores in output.scores] if output_scores else None
    return tokens, top5
