"""GLA in Transformers' Auto classes: after `import assay`, AutoModelForCausalLM.from_pretrained(<fla-layout
GLA folder>) gives assay's GLA, and generate() decodes with the model's fixed-size state as its cache.

Tolerance: logits with ("model_logits", float32), relative error <= 1e-5 against the native model on
the same weights (the same modules run: only the path through them differs).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from assay.core.numerics import assert_close


def _run(code: str) -> dict:
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_import_assay_registers_gla_lazily_in_a_fresh_process(zoo_dir):
    # Loading a tokenizer makes Transformers import its Auto model module, where assay registers GLA: a stand-in
    # that imports the model class (and Transformers' modeling code with it) at the first from_pretrained or
    # from_config, and then registers the class itself.
    result = _run(f"""
import json, sys
import assay
light = not any(name in sys.modules for name in ("torch", "transformers"))
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
AutoTokenizer.from_pretrained({str(zoo_dir / "gla")!r})
config = AutoConfig.from_pretrained({str(zoo_dir / "gla")!r})
registered = type(config) in MODEL_FOR_CAUSAL_LM_MAPPING
deferred = not any(name in sys.modules for name in ("assay.models.gla.hf_model", "transformers.modeling_utils"))
model = AutoModelForCausalLM.from_pretrained({str(zoo_dir / "gla")!r})
fresh = AutoModelForCausalLM.from_config(config)
print(json.dumps({{"light": light, "registered": registered, "deferred": deferred, "config": type(config).__name__,
                  "model": type(model).__module__ + "." + type(model).__name__, "from_config": type(fresh).__name__,
                  "now_held": MODEL_FOR_CAUSAL_LM_MAPPING[type(config)] is type(model)}}))
""")
    assert result == {"light": True, "registered": True, "deferred": True, "config": "GLAConfig",
                      "model": "assay.models.gla.hf_model.GLAForCausalLM", "from_config": "GLAForCausalLM", "now_held": True}


@pytest.mark.slow
def test_transformers_imported_before_assay_still_gets_gla(zoo_dir):
    result = _run(f"""
import json
from transformers import AutoModelForCausalLM
import assay
model = AutoModelForCausalLM.from_pretrained({str(zoo_dir / "gla")!r})
print(json.dumps({{"model": type(model).__name__}}))
""")
    assert result == {"model": "GLAForCausalLM"}


@pytest.fixture(scope="module")
def pair(zoo_dir):
    """(Transformers' GLAForCausalLM, the native GLA) on the zoo's pretrained GLA weights."""
    from transformers import AutoModelForCausalLM

    from assay.models.gla import SPEC

    hf = AutoModelForCausalLM.from_pretrained(zoo_dir / "gla-pretrained", dtype=torch.float32).eval()
    native, _ = SPEC.load(zoo_dir / "gla-pretrained")
    return hf, native.eval()


def test_every_checkpoint_tensor_lands_in_the_native_modules(zoo_dir, pair):
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(zoo_dir / "gla", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    hf, native = pair
    tokens = torch.randint(3, 1024, (2, 50), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close("model_logits", hf(input_ids=tokens, use_cache=False).logits.double(), native(tokens).double(), torch.float32)


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_generate_decodes_with_the_fixed_state_as_its_cache(pair, cache_implementation):
    from transformers.cache_utils import LinearAttentionLayer

    hf, native = pair
    prompt = torch.randint(3, 1024, (1, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        output = hf.generate(prompt, max_new_tokens=10, min_new_tokens=10, do_sample=False, cache_implementation=cache_implementation,
                             return_dict_in_generate=True)
        expected = native.generate(prompt, 10)
    assert output.sequences.tolist() == expected.tolist()  # greedy: prefill then one recurrent step per token
    cache = output.cache
    args = native.args
    assert len(cache.layers) == args.n_layers and all(isinstance(layer, LinearAttentionLayer) for layer in cache.layers)
    # one [B, H, K, V] float32 state per layer, the same after 47 tokens as it would be after 47,000
    assert all(tuple(layer.recurrent_states[0].shape) == (1, args.n_heads, args.head_k_dim, args.head_v_dim) for layer in cache.layers)
    assert all(layer.recurrent_states[0].dtype == torch.float32 for layer in cache.layers)
