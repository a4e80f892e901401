"""Training a real pretrained checkpoint (SmolLM2-135M-Instruct, the session's `real_model_dir`) through
the native Llama: --check-init tells its weights from random ones, the three paths start at one loss,
and the export reloads in Transformers with its embeddings still tied.

Tolerances: first-step losses with ("train_loss", float32) <= 1e-4 relative: the paths compute the same
float32 math in another order (Transformers' attention and MLP modules vs the native ones vs the
kernels), so only rounding can separate them (measured: bit-identical, bench/results/real_train.json). Logits after export with
("model_logits", float32) <= 1e-5: the same weights, reloaded.
"""

from __future__ import annotations

import math

import pytest
import torch

from assay.core.numerics import assert_close
from assay.train import TrainRequest, train

pytestmark = pytest.mark.slow

# One short batch keeps a 135M-parameter step near a second on two cores.
STEP = dict(batch=2, seq_len=64)


def test_check_init_tells_the_real_weights_from_random_ones(real_model_dir):
    result = train(TrainRequest(model=str(real_model_dir), check_init=True, steps=0, **STEP))
    check = result.check_init
    assert check.ln_vocab == pytest.approx(math.log(49152))
    assert check.weights_loaded, check.verdict
    # Pretrained English: a few nats per token (measured 2.9 on 2 x 128 tokens); a random init sits at or above ln(vocab).
    assert check.loaded_loss < 0.5 * check.ln_vocab, check
    assert check.random_loss > 0.95 * check.ln_vocab, check


def test_hf_native_and_kernels_start_at_one_loss_and_the_export_stays_tied(real_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common = dict(model=str(real_model_dir), steps=2, **STEP)
    hf = train(TrainRequest(path="hf", **common))
    native = train(TrainRequest(path="native", export_hf=tmp_path / "export", **common))
    kernels = train(TrainRequest(path="native", kernels=("rope", "attention"), **common))
    assert native.model.family.name == "llama" and native.model.args.tie_embeddings
    assert len(kernels.kernels) == 2 * 30  # rope and attention in each of the 30 blocks
    for result in (native, kernels):
        assert_close("train_loss", torch.tensor(result.losses[:1]), torch.tensor(hf.losses[:1]), torch.float32)
    assert hf.losses[0] < 5.0  # pretrained: far below ln(49152) = 10.8

    # The trained native model, exported and reloaded by Transformers: lm_head is the embedding again
    # (one storage, as Transformers ties it), not an untied copy, and the logits are the native model's.
    model = native.model.model.eval()
    assert model.output.weight is model.tok_embeddings.weight
    reloaded, info = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert reloaded.config.tie_word_embeddings
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    tokens = torch.randint(0, 49152, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close("model_logits", reloaded.eval()(input_ids=tokens).logits.double(), model(tokens).double(), torch.float32)
    # The real tokenizer travels with it, chat template included.
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "export")
    assert tokenizer.chat_template and len(tokenizer) == 49152
