"""--compile: each transformer block through core.compiling.compile_fn; losses equal eager within the
("train_loss", float32) tolerance (relative error <= 1e-4), and N identical blocks compile once."""

from __future__ import annotations

import pytest
import torch

from assay.core.numerics import assert_close
from assay.train import TrainRequest, train


@pytest.mark.slow
@pytest.mark.parametrize("path", ["native", "hf"])
def test_compiled_blocks_train_like_eager(train_zoo, path):
    from assay.core.compiling import reset

    reset()  # counters below are for this run alone, whatever compiled earlier in the session
    model = str(train_zoo / "qwen3")
    eager = train(TrainRequest(model=model, path=path, steps=3, seq_len=32))
    compiled = train(TrainRequest(model=model, path=path, steps=3, seq_len=32, compile=True, backend="aot_eager"))
    assert_close("train_loss", torch.tensor(compiled.losses), torch.tensor(eager.losses), torch.float32)
    stats = compiled.summary["compile"]
    # Both blocks share one compiled forward: one graph, no recompilation, no graph break.
    assert (stats["graphs"], stats["recompiles"], stats["graph_breaks"]) == (1, 0, 0), stats
    assert compiled.records[0]["warmup"] and not compiled.records[1]["warmup"]


def test_compiled_model_keeps_its_state_dict_keys(train_zoo, tmp_path):
    from transformers import AutoModelForCausalLM

    from assay.core.numerics import assert_close as close

    out = tmp_path / "export"
    result = train(TrainRequest(model=str(train_zoo / "qwen3"), steps=1, seq_len=32, compile=True, backend="aot_eager", export_hf=out))
    tokens = torch.randint(0, 1024, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        close("model_logits", AutoModelForCausalLM.from_pretrained(out)(tokens).logits, result.model.logits(tokens), torch.float32)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(compile=True, compile_mode="max-autotune-turbo"), "unknown compile mode"),
        (dict(compile=True, backend="aot_eager", compile_mode="max-autotune-no-cudagraphs"), "needs the inductor backend"),
        (dict(compile_mode="max-autotune-no-cudagraphs"), "needs --compile"),
    ],
)
def test_compile_mode_refuses_what_it_cannot_do_before_loading(tmp_path, changes, message):
    from assay.core.errors import AssayError

    # A model folder that does not exist: the request is refused before anything is loaded.
    with pytest.raises(AssayError, match=message):
        train(TrainRequest(model=str(tmp_path / "absent"), steps=1, seq_len=32, **changes))


@pytest.mark.inductor
def test_max_autotune_mode_compiles_zoo_blocks_without_a_break(train_zoo):
    import torch._inductor.config
    from torch._dynamo.utils import counters

    from assay.core.compiling import CompileStats, compile_fn, reset

    reset()
    model = str(train_zoo / "qwen3")
    eager = train(TrainRequest(model=model, steps=2, seq_len=32))
    compiled = train(TrainRequest(model=model, steps=2, seq_len=32, compile=True, compile_mode="max-autotune-no-cudagraphs"))
    stats = compiled.summary["compile"]
    assert (stats["graphs"], stats["recompiles"], stats["graph_breaks"], stats["mode"]) == (1, 0, 0, "max-autotune-no-cudagraphs"), stats
    assert_close("train_loss", torch.tensor(compiled.losses), torch.tensor(eager.losses), torch.float32)
    # The mode reaches inductor through the counting backend: a bmm (offered the C++ GEMM template with any
    # operands; training's mm only with constant weights) is autotuned between aten and the template.
    # Inductor's caches off for it: a graph an earlier test or run cached comes back with no autotuning.
    autotuned = counters["inductor"]["select_algorithm_autotune"]
    a, b = torch.randn(1, 16, 16), torch.randn(1, 16, 16)
    bmm = compile_fn(lambda a, b: torch.bmm(a, b), "inductor", CompileStats(), mode="max-autotune-no-cudagraphs")
    with torch._inductor.config.patch(force_disable_caches=True):
        assert_close("kernel", bmm(a, b), torch.bmm(a.double(), b.double()), torch.float32)
    assert counters["inductor"]["select_algorithm_autotune"] > autotuned
