"""The replacement registry: named kernels swapped into a native Qwen3 by module-name patterns."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from assay.core.errors import AssayError
from assay.kernels.attention import KernelCausalAttention
from assay.kernels.grouped_experts import KernelGroupedExperts
from assay.kernels.registry import (
    KERNELS,
    Kernel,
    apply_kernels,
    get_kernel,
    kernel_names,
    register_kernel,
    replaced_modules,
    select_impl,
    unregister_kernel,
)
from assay.kernels.rope import KernelRotaryEmbedding, rope_bthd
from assay.models.qwen3 import FLAVOURS, Qwen3
from assay.models.qwen3.model import Attention, RotaryEmbedding


def tiny(flavour: str = "tiny", **overrides):
    return Qwen3.build(replace(FLAVOURS[flavour], max_seq_len=64, **overrides))


def test_builtin_kernels_are_one_registry_entry_each():
    assert {"rope", "grouped_experts", "attention"} <= set(KERNELS)
    assert all(value.count(":") == 1 for value in KERNELS.values())
    for name in ("rope", "grouped_experts", "attention"):
        assert get_kernel(name).name == name


def test_rope_replaces_one_module_per_layer_and_logs_each(caplog):
    model = tiny(n_layers=3)
    with caplog.at_level(logging.INFO, logger="assay.kernels"):
        replacements = apply_kernels(model, ["rope"])
    assert [r.module for r in replacements] == [f"layers.{i}.attention.rope" for i in range(3)]
    assert all((r.kernel, r.old_class, r.new_class) == ("rope", "RotaryEmbedding", "KernelRotaryEmbedding") for r in replacements)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "assay.kernels"]
    per_module = [line for line in lines if "replaced layers." in line]
    assert len(per_module) == 3 and all("RotaryEmbedding -> KernelRotaryEmbedding (rope)" in line for line in per_module)
    assert lines[-1] == "kernels: replaced 3 module(s): rope x3"
    assert all(isinstance(block.attention.rope, KernelRotaryEmbedding) for block in model.layers)


def test_pattern_narrows_replacements_to_matching_layers():
    model = tiny("tiny-moe", n_layers=3)
    replacements = apply_kernels(model, ["rope", "grouped_experts"], pattern="layers.0.*")
    assert sorted(r.module for r in replacements) == ["layers.0.attention.rope", "layers.0.moe.experts"]
    assert type(model.layers[1].attention.rope) is RotaryEmbedding


def test_pattern_on_a_containing_module_selects_what_is_inside_it():
    model = tiny(n_layers=2)
    replacements = apply_kernels(model, ["rope", "attention"], pattern="layers.*.attention")
    assert sorted(r.module for r in replacements) == [
        "layers.0.attention.rope", "layers.0.attention.sdpa", "layers.1.attention.rope", "layers.1.attention.sdpa",
    ]
    assert isinstance(model.layers[1].attention.sdpa, KernelCausalAttention)


def test_bracket_glob_and_several_patterns():
    model = tiny(n_layers=5)
    replacements = apply_kernels(model, ["rope"], pattern="layers.[0-1].*, layers.4.*")
    assert [r.module.split(".")[1] for r in replacements] == ["0", "1", "4"]


def test_dry_run_lists_replacements_and_changes_nothing(caplog):
    model = tiny(n_layers=2)
    with caplog.at_level(logging.INFO, logger="assay.kernels"):
        replacements = apply_kernels(model, ["rope"], dry_run=True)
    assert [str(r) for r in replacements] == [
        f"layers.{i}.attention.rope: RotaryEmbedding -> KernelRotaryEmbedding (rope)" for i in range(2)
    ]
    assert all(type(block.attention.rope) is RotaryEmbedding for block in model.layers)
    assert replaced_modules(model) == {}
    assert any("would replace 2 module(s)" in rec.getMessage() for rec in caplog.records)


def test_pattern_that_matches_nothing_is_an_error():
    model = tiny()
    with pytest.raises(AssayError, match=r"kernel filter 'layers\.9\.\*' matches no module"):
        apply_kernels(model, ["rope"], pattern="layers.9.*")
    assert replaced_modules(model) == {}


def test_kernel_without_a_target_in_the_selection_is_an_error():
    with pytest.raises(AssayError, match="grouped_experts: no GroupedExperts module"):
        apply_kernels(tiny(), ["grouped_experts"])
    with pytest.raises(AssayError, match="no RotaryEmbedding module within 'output'"):
        apply_kernels(tiny(), ["rope"], pattern="output")


def test_unknown_kernel_is_an_error():
    with pytest.raises(AssayError, match="unknown kernel 'flash'; registered: .*rope"):
        apply_kernels(tiny(), ["flash"])


def test_second_replacement_of_a_module_is_refused():
    model = tiny()
    apply_kernels(model, ["rope"])
    with pytest.raises(AssayError, match="layers.0.attention.rope was already replaced by kernel rope"):
        apply_kernels(model, ["rope"])


def _other_rope(module: RotaryEmbedding) -> RotaryEmbedding:
    return KernelRotaryEmbedding()


def test_two_kernels_on_one_module_are_refused():
    rival = replace(get_kernel("rope"), name="rope_rival", build=_other_rope)
    register_kernel(rival)
    try:
        model = tiny()
        with pytest.raises(AssayError, match="layers.0.attention.rope would be replaced twice, by rope and by rope_rival"):
            apply_kernels(model, ["rope", "rope_rival"])
        assert replaced_modules(model) == {}
    finally:
        unregister_kernel("rope_rival")


def test_a_replacement_inside_a_replaced_module_is_refused():
    whole = replace(get_kernel("rope"), name="whole_attention", target=Attention, build=lambda module: module)
    register_kernel(whole)
    try:
        with pytest.raises(AssayError, match=r"layers.0.attention.rope \(rope\) lies inside layers.0.attention \(whole_attention\)"):
            apply_kernels(tiny(), ["rope", "whole_attention"])
    finally:
        unregister_kernel("whole_attention")


def test_registering_a_kernel_from_python_makes_it_applicable_by_name():
    register_kernel(replace(get_kernel("attention"), name="my_attention"))
    try:
        assert "my_attention" in kernel_names()
        replacements = apply_kernels(tiny(), ["my_attention"], pattern="layers.1.*")
        assert [(r.module, r.kernel) for r in replacements] == [("layers.1.attention.sdpa", "my_attention")]
        with pytest.raises(AssayError, match="already registered"):
            register_kernel(replace(get_kernel("attention"), name="my_attention"))
    finally:
        unregister_kernel("my_attention")


def test_no_names_applies_every_kernel_that_finds_a_module():
    replacements = apply_kernels(tiny("tiny-moe"), None, pattern="layers.1.*", dry_run=True)
    assert sorted(r.kernel for r in replacements) == ["attention", "grouped_experts", "rope"]


def test_grouped_experts_replacement_keeps_parameters_and_state_dict_keys():
    model = tiny("tiny-moe")
    before = model.state_dict()
    old = model.layers[0].moe.experts
    apply_kernels(model, ["grouped_experts"])
    new = model.layers[0].moe.experts
    assert isinstance(new, KernelGroupedExperts)
    assert new.w1 is old.w1 and new.w2 is old.w2 and new.w3 is old.w3
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[key], before[key]) for key in before)


def test_error_constraint_is_a_clear_error():
    q = torch.randn(1, 4, 2, 7)
    cos, sin = torch.randn(4, 7), torch.randn(4, 7)
    with pytest.raises(AssayError, match=r"kernel rope: q.shape\[-1\] must be a multiple of 2 .*got q of shape \(1, 4, 2, 7\)"):
        rope_bthd(q, q, cos, sin)


def test_fallback_constraint_moves_grouped_experts_to_the_loop():
    kernel = get_kernel("grouped_experts")
    aligned = {"x": torch.randn(4, 64), "w1": torch.randn(2, 32, 64), "w2": torch.randn(2, 64, 32), "w3": torch.randn(2, 32, 64)}
    odd = {"x": torch.randn(4, 33), "w1": torch.randn(2, 17, 33), "w2": torch.randn(2, 33, 17), "w3": torch.randn(2, 17, 33)}
    assert select_impl(kernel, torch.device("cpu"), aligned) == "grouped_mm"
    assert select_impl(kernel, torch.device("cpu"), odd) == "loop"
    # float64: torch._grouped_mm does not take it on CPU; the loop does.
    as64 = {name: tensor.double() for name, tensor in aligned.items()}
    assert select_impl(kernel, torch.device("cpu"), as64) == "loop"


def test_kernel_definitions_are_complete():
    for kernel in (get_kernel(name) for name in ("rope", "grouped_experts", "attention")):
        assert isinstance(kernel, Kernel)
        assert kernel.cases and kernel.bench_cases and kernel.outputs and kernel.grad_inputs
        assert kernel.impls[0] != "triton" and "triton" in kernel.impls
