"""The compiled decode's GEMM per width (serve/runner/gemm.py): inductor's C++ template for narrow steps on an
x86 CPU, the library GEMM elsewhere; a choice that cannot serve is one line before anything loads."""

from __future__ import annotations


import pytest
import torch

from assay.core.errors import AssayError
from assay.core.numerics import tolerance
from assay.serve import Engine, EngineConfig, run_to_completion
from assay.serve.runner.gemm import CPP_MAX_WIDTH, CPP_MAX_WIDTH_AMX, cpp_max_width, cpp_template_available, decode_gemm, template_copy_bytes

X86 = cpp_template_available("cpu", "inductor")  # an x86 CPU


@pytest.mark.skipif(not X86, reason="the C++ GEMM template's micro-kernels are x86 (AVX2/AVX-512) code")
@pytest.mark.parametrize("choice, device, backend, width, dtype, expected", [
    ("auto", "cpu", "inductor", 1, "float32", "cpp"),
    ("auto", "cpu", "inductor", 8, "float32", "cpp"),
    ("auto", "cpu", "inductor", 16, "float32", "aten"),  # measured: the template 1.13x the library's step
    ("auto", "cpu", "inductor", 16, "bfloat16", "cpp"),  # measured: 0.87x
    ("auto", "cpu", "inductor", 32, "bfloat16", "aten"),  # 0.98x: not worth its compile and packed copy
    ("auto", "cpu", "inductor", 4, "int8", "cpp"),  # --quantize int8, measured: 0.65x
    ("auto", "cpu", "inductor", 8, "int8", "aten"),  # 0.98x
    ("auto", "cpu", "aot_eager", 1, "float32", "aten"),  # no inductor, no template
    ("auto", "cuda", "inductor", 1, "float32", "aten"),
    ("auto", "cpu", None, 1, "float32", "aten"),  # eager decode
    ("cpp", "cpu", "inductor", 64, "float32", "cpp"),
    ("aten", "cpu", "inductor", 1, "bfloat16", "aten"),
])
def test_each_width_gets_the_gemm_the_choice_names(choice, device, backend, width, dtype, expected):
    # The table measured on an AVX-512 CPU without AMX tiles.
    assert decode_gemm(choice, device, backend, width, dtype, amx=False) == expected
    assert CPP_MAX_WIDTH == {"float32": 8, "bfloat16": 16, "int8": 4}


@pytest.mark.skipif(not X86, reason="the C++ GEMM template's micro-kernels are x86 (AVX2/AVX-512) code")
def test_a_cpu_with_amx_tiles_gives_the_template_bfloat16_steps_up_to_32():
    # Measured on a 2-core Xeon with AMX: the template's bfloat16 step 0.62x the library's at 8, 0.77x at 32.
    assert CPP_MAX_WIDTH_AMX == {"float32": 8, "bfloat16": 32, "int8": 4}
    assert decode_gemm("auto", "cpu", "inductor", 32, "bfloat16", amx=True) == "cpp"
    assert decode_gemm("auto", "cpu", "inductor", 64, "bfloat16", amx=True) == "aten"
    assert decode_gemm("auto", "cpu", "inductor", 16, "float32", amx=True) == "aten"  # float32 does not use AMX
    import torch

    # Left to the CPU: this machine's own answer.
    assert cpp_max_width("bfloat16") == (32 if torch.cpu._is_amx_tile_supported() else 16)


@pytest.mark.skipif(not X86, reason="the C++ GEMM template's micro-kernels are x86 (AVX2/AVX-512) code")
def test_auto_keeps_the_library_gemm_for_a_width_whose_packed_weights_would_not_fit():
    weights = 538_000_000  # SmolLM2's float32 matmul weights
    need = template_copy_bytes(weights)
    assert need >= 2.6 * weights  # measured: up to 2.6x the weights added per template width
    assert decode_gemm("auto", "cpu", "inductor", 1, "float32", need, weights) == "cpp"
    assert decode_gemm("auto", "cpu", "inductor", 1, "float32", need - 1, weights) == "aten"
    assert decode_gemm("auto", "cpu", "inductor", 1, "float32", None, weights) == "cpp"  # memory unknown: the table alone
    assert decode_gemm("cpp", "cpu", "inductor", 1, "float32", 0, weights) == "cpp"  # asked for by name: kept


def test_the_template_where_it_cannot_run_and_an_unknown_gemm_are_refused_before_loading(zoo_dir, assay_cli):
    with pytest.raises(AssayError, match="needs the inductor backend"):
        EngineConfig(backend="aot_eager", decode_gemm="cpp").validate()
    with pytest.raises(AssayError, match="needs the inductor backend"):
        EngineConfig(eager=True, decode_gemm="cpp").validate()
    for flags, said in ((["--decode-gemm", "fast"], "--decode-gemm must be one of auto, cpp, aten, got 'fast'"),
                        (["--decode-gemm", "cpp", "--backend", "aot_eager"], "--decode-gemm cpp needs the inductor backend")):
        result = assay_cli("serve", "--model", str(zoo_dir / "llama"), "--port", "0", *flags)
        assert result.returncode == 2, result.stderr[-2000:]
        assert said in result.stderr and "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.inductor
@pytest.mark.skipif(not X86, reason="the C++ GEMM template's micro-kernels are x86 (AVX2/AVX-512) code")
def test_narrow_widths_are_autotuned_over_the_template_and_decode_as_eager_does(zoo_dir):
    from torch._dynamo.utils import counters
    import torch._inductor.config as inductor_config

    wide = 2 * CPP_MAX_WIDTH["float32"]
    engine = Engine.from_checkpoint(zoo_dir / "llama", EngineConfig(max_seqs=wide, buckets=(1, wide), backend="inductor",
                                                                    check_eager=True, max_len=64))
    # Compiled afresh (no inductor cache): max-autotune's choice among the template and aten is what is counted.
    with inductor_config.patch(force_disable_caches=True):
        before = counters["inductor"]["select_algorithm_autotune"]
        engine.runner.warm_up([1])
        narrow = counters["inductor"]["select_algorithm_autotune"] - before
        engine.runner.warm_up([wide])
        widened = counters["inductor"]["select_algorithm_autotune"] - before - narrow
    assert engine.runner.decoder.gemms == {1: "cpp", wide: "aten"}
    assert narrow > 0, "width 1 was not compiled with max-autotune over the C++ template"
    assert widened == 0, "the wide step was autotuned: it should run the library GEMM"

    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [100, 200, 300]]
    engine.add_request("alone", prompts[0], max_tokens=5)
    alone = run_to_completion(engine)["alone"]  # width 1: the template's graph
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, max_tokens=5)
    together = run_to_completion(engine)  # width 16: three rows and thirteen padding rows
    check = engine.stats().as_dict()["eager_check"]
    assert check["steps"] == engine.stats().as_dict()["decode_steps"] > 0
    # ("compiled_vs_eager", float32) = 1e-4: the template's blocking reassociates float32 sums, nothing more.
    assert check["max_rel"] <= tolerance("compiled_vs_eager", torch.float32)
    assert together["r0"] == alone
