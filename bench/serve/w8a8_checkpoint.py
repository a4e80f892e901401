"""An int8 checkpoint vLLM's CPU build serves, from a Llama-layout Hugging Face checkpoint: compressed-tensors'
"int-quantized" W8A8 format (each decoder linear's weight int8 with one float32 scale per output row, max |w| / 127
as `assay serve --quantize int8` rounds it; activations rounded to int8 per token at run time by vLLM).

vLLM's CPU build has no int8 weight-only kernel (its WNA16 CPU kernel takes 4-bit weights only), so W8A8 is the
int8 it can serve: the weights are assay's int8 weights; the activations, bfloat16 at the kernel's input as in
assay's int8 kernel, are then rounded to int8 per token. vLLM's CPU int8 kernel takes bfloat16 activations only:
serve it with --dtype bfloat16. The embedding stays in the checkpoint's dtype (compressed-tensors quantizes
linears; a tied head is the embedding).

    python bench/serve/w8a8_checkpoint.py smollm2/ smollm2-w8a8/
    vllm serve smollm2-w8a8/ --dtype bfloat16 ...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: this checkout's `assay`

import argparse
import json
import shutil

from safetensors.torch import load_file, save_file

from assay.serve.runner.quantize import int8_rows

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
        }
    },
    "ignore": ["lm_head"],
}


def convert(source: Path, target: Path) -> int:
    """Write target/ (config.json with the quantization config, model.safetensors, the tokenizer files); the
    number of linears quantized."""
    config = json.loads((source / "config.json").read_text())
    if config.get("model_type") != "llama" or len(list(source.glob("*.safetensors"))) != 1:
        raise SystemExit(f"error: {source}: a Llama-layout checkpoint in one model.safetensors is what this converts")
    tensors, quantized = {}, 0
    for name, tensor in load_file(source / "model.safetensors").items():
        if name.endswith(".weight") and name.split(".")[-2] in LINEARS:
            weight_int8, scale = int8_rows(tensor)  # as `assay serve --quantize int8` rounds it
            tensors[name], tensors[name.removesuffix("weight") + "weight_scale"] = weight_int8, scale[:, None]
            quantized += 1
        else:
            tensors[name] = tensor.contiguous()
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name not in ("config.json", "model.safetensors"):
            shutil.copy2(path, target / path.name)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(config | {"quantization_config": QUANTIZATION_CONFIG}, indent=2))
    return quantized


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="the float checkpoint folder")
    parser.add_argument("target", type=Path, help="where the W8A8 checkpoint goes")
    args = parser.parse_args()
    if not (args.source / "config.json").is_file():
        parser.error(f"{args.source}: no config.json there")
    count = convert(args.source, args.target)
    print(f"wrote {args.target}: {count} linears in int8 (per output row), W8A8 compressed-tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
