"""The probe's recipe: load a checkpoint, build its inputs, generate greedily with a static cache.

This module is copied verbatim into every result's run.py, so it imports nothing but torch,
transformers and PIL: what the probe ran is exactly what a user re-runs.
"""

import json
import os

import torch

PROMPT = "The Python language reference describes the syntax and the core semantics of the language. A function"
IMAGE_PROMPT = "Describe this image."
IMAGE_TASK = "image-text-to-text"


def load_model(model_id, task, device, dtype, parallelism="single", num_devices=1):
    """from_pretrained on the device, in the dtype; Hub ids and local folders take the same path.

    Sharded (inside a torch.distributed process group): "tensor" uses the model's tp_plan, "expert"
    its expert-parallel plan alone (MoE models without a tensor-parallel plan).
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if task == IMAGE_TASK else AutoModelForCausalLM
    kwargs = {}
    if parallelism == "tensor":
        kwargs["tp_plan"] = "auto"
    elif parallelism == "expert":
        from transformers import DistributedConfig

        # Experts split across the ranks; the dense weights FSDP-sharded over the same ranks.
        kwargs["distributed_config"] = DistributedConfig(ep_size=num_devices, fsdp_size=num_devices, tp_size=1)
    model = auto.from_pretrained(model_id, dtype=getattr(torch, dtype), **kwargs)
    if parallelism == "single":
        model = model.to(device)
    return model.eval()


def launch(fn, num_devices, device_type, args=()):
    """Run fn(*args) on `num_devices` torch.distributed processes started here (no torchrun needed).

    Returns what rank 0 returned: JSON values, or a dict of them and of tensors (save_result). Each
    process gets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* as under torchrun, and a process group (gloo on CPU,
    the device's own backend elsewhere).
    """
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as scratch:
        result_file = os.path.join(scratch, "rank0.json")
        mp.spawn(_rank_entry, args=(fn, num_devices, device_type, port, result_file, args), nprocs=num_devices, join=True)
        return load_result(result_file)


def save_result(result, path):
    """Rank 0's result as JSON, its top-level tensors (a dict's) as safetensors beside it: nothing that
    reading it back could execute, as unpickling could."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in result.items() if isinstance(v, torch.Tensor)} if isinstance(result, dict) else {}
    if tensors:
        save_file(tensors, path + ".safetensors")
        result = {k: v for k, v in result.items() if k not in tensors}
    with open(path, "w") as handle:
        json.dump({"result": result, "tensors": sorted(tensors)}, handle)


def load_result(path):
    from safetensors.torch import load_file

    with open(path) as handle:
        saved = json.load(handle)
    result = saved["result"]
    if saved["tensors"]:
        result.update(load_file(path + ".safetensors"))
    return result


def _rank_entry(rank, fn, world_size, device_type, port, result_file, args):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    if device_type != "cpu":
        getattr(torch, device_type).set_device(rank)
    dist.init_process_group("gloo" if device_type == "cpu" else None)
    try:
        result = fn(*args)
        if rank == 0:
            save_result(result, result_file)
        # Every rank leaves together: a rank tearing gloo down while a peer is still busy can make the
        # peer's transport thread see a closed connection and abort (SIGABRT) after the work was done.
        dist.barrier()
    finally:
        dist.destroy_process_group()


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


def cache_kind(model):
    """ "fixed_state" for a stateful model (a fixed-size recurrent state per layer, e.g. GLA: no keys or
    values, nothing grows with the length), else "static_kv" (a static key/value cache)."""
    return "fixed_state" if getattr(model, "_is_stateful", False) else "static_kv"


# Transformers' sliding-window static cache layer keeps its length in a Python int
# (StaticSlidingWindowLayer.cumulative_length_int). Dynamo specialises on a plain int, so every decode
# step recompiled until dynamo's recompile limit (8), after which the steps ran eager: mistral, gemma2
# and gemma3 passed with 8 graphs and most of their tokens uncompiled. Marking that int dynamic gives one
# graph while the window fills and one after (measured: 8 graphs -> 2 for mistral, 32 tokens).
DYNAMIC_SOURCES = r".*\.cumulative_length_int"


def generate(model, inputs, new_tokens, config=None, output_scores=False):
    """Greedy generation of exactly `new_tokens` tokens with a static cache; config=None runs eager.

    Static cache: every decode step has the same shapes, so a compiled graph is reused instead of
    recompiled per token (the reference system's condition for compiling at all). For a fixed-state
    model (cache_kind "fixed_state") Transformers' static cache holds only each layer's recurrent state,
    allocated once: no key/value cache and no maximum length.
    """
    tokens, top5, _ = generate_logits(model, inputs, new_tokens, config, output_scores=output_scores, output_logits=False)
    return tokens, top5


def generate_logits(model, inputs, new_tokens, config=None, output_scores=True, output_logits=True):
    """generate(), also returning each step's raw logits as one [steps, vocab] tensor (None unless asked).

    Raw logits, not scores: the scores have been through the logits processors (min_new_tokens sets
    the end-of-sequence logit to -inf), which would hide what the model computed.
    """
    kwargs = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        cache_implementation="static",
        return_dict_in_generate=True,
        output_scores=output_scores,
        output_logits=output_logits,
    )
    if config is None:
        kwargs["disable_compile"] = True
    else:
        kwargs["compile_config"] = config
    # no_grad, not inference_mode: sharded (FSDP/expert-parallel) parameters must keep version counters.
    # A model that still reaches the recompile limit fails loudly instead of finishing eager: a row
    # compiled in name only would say nothing about the compiler.
    with torch.no_grad(), torch.compiler.config.patch(dynamic_sources=DYNAMIC_SOURCES, fail_on_recompile_limit_hit=True):
        output = model.generate(**inputs, **kwargs)
    prompt_length = inputs["input_ids"].shape[1]
    tokens = output.sequences[0, prompt_length:].tolist()
    top5 = [step_scores[0].float().topk(5).indices.tolist() for step_scores in output.scores] if output_scores else None
    logits = torch.stack([step_logits[0] for step_logits in output.logits]) if output_logits else None
    return tokens, top5, logits
