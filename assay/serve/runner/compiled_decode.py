"""The decode step the engine runs every step: eager, or compiled once per width (dynamic=False, as the
reference system measured), with the time and the compiles of each call recorded.

A compiled graph has static shapes, so each width is its own graph; warm_up compiles the widths a
bucket set can reach before serving, so no request ever waits on the compiler. Each width's graph is
compiled with the GEMM gemm.py picks for it (inductor's C++ template for narrow steps on an x86 CPU).
"""

from __future__ import annotations

import contextlib
import logging

import torch

from assay.core.compiling import CompileStats, compile_fn, fresh_function, timed_call
from assay.core.device import free_memory_bytes
from assay.serve.runner.gemm import decode_gemm, inductor_patches, template_copy_bytes
from assay.serve.runner.weights import SlotModel, matmul_weight_bytes, weights_dtype

log = logging.getLogger("assay.serve")


# Bumped whenever any module anywhere gets a parameter, buffer or submodule (nn.Module's global registration
# hooks, which Module.__setattr__ and register_* call): a decode that skips dynamo's guards (CompiledDecode.__call__)
# runs only while this is unchanged since its width's last guarded call.
_module_changes = 0


def _count_module_change(module, name, value):
    global _module_changes
    # Inside a region dynamo traces (a model compiled elsewhere in the process that sets a module attribute), a
    # count would be a global that changes on every call: dynamo would guard on it and recompile each call until
    # its limit. The attribute is set for real when the compiled code runs, and that call counts.
    if torch.compiler.is_compiling():
        return
    _module_changes += 1  # returns None: the registration goes ahead unchanged


torch.nn.modules.module.register_module_parameter_registration_hook(_count_module_change)
torch.nn.modules.module.register_module_buffer_registration_hook(_count_module_change)
torch.nn.modules.module.register_module_module_registration_hook(_count_module_change)


def _decode_call(slot_model: SlotModel, tokens, slot_ids, positions, buffers):
    # tokens: [W, 1]; slot_ids, positions: [W] -> logits [W, vocab]
    return slot_model.decode(tokens, slot_ids, positions, buffers)


class CompiledDecode:
    """slot_model.decode, eager (backend None) or compiled with `backend`; its compiles counted in compile_stats.
    gemm: the --decode-gemm choice (gemm.DECODE_GEMMS), resolved per width when that width first runs."""

    def __init__(self, slot_model: SlotModel, backend: str | None, max_seqs: int, device: torch.device, gemm: str = "auto"):
        self.slot_model = slot_model
        self.eager = backend is None
        self.backend = backend
        self.device = device
        self.gemm = gemm
        self.weights_dtype = weights_dtype(slot_model)  # "float32", "bfloat16" or "int8": auto's widest template width depends on it
        self.weight_bytes = matmul_weight_bytes(slot_model.model)  # the template's packed copy per width is sized from it
        self.gemms: dict[int, str] = {}  # width -> the GEMM its graph was compiled with ("cpp" or "aten")
        self.compile_stats = CompileStats()
        if self.eager:
            self._decode = slot_model.decode
        else:
            # dynamic=False: every width is its own static graph, the behaviour the reference system measured.
            self._decode = compile_fn(fresh_function(_decode_call), backend, self.compile_stats, dynamic=False)
        # Without buckets every running count up to max_seqs may be a new graph; dynamo's default limit (8
        # per function) would silently fall back to eager past it.
        self._recompile_limit = max(64, max_seqs + 8)
        # (width, grad and inference modes, the cache tensors, module changes) whose graph has run: see __call__
        self.compiled: set[tuple] = set()

    def __call__(self, tokens, slot_ids, positions, buffers) -> torch.Tensor:
        if self.eager:
            return self._decode(tokens, slot_ids, positions, buffers)
        key = (tokens.shape[0], torch.is_grad_enabled(), torch.is_inference_mode_enabled(), tuple(map(id, buffers)), _module_changes)
        if key in self.compiled:
            # A width whose graph has run on these cache tensors, with no module changed since, gets it again with
            # only the guards that tell the cached graphs apart (the input's width). The rest, one per parameter and
            # cache tensor, cost 0.5 ms of a 19.9 ms step of one sequence (SmolLM2, 2-core AVX2 EPYC); vLLM likewise
            # calls its compiled graphs without dynamo's guards once warmed up. A new parameter, buffer or submodule
            # set anywhere (outside a compiled region) changes _module_changes and so the key: the next call checks
            # every guard. (A plain attribute set on a module after warm-up is not seen here; the engine sets none.)
            # Config patches only matter to a compile, so none here.
            try:
                with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                    return self._decode(self.slot_model, tokens, slot_ids, positions, buffers)
            except RuntimeError as error:
                # The guards that are still checked found no graph for these inputs (a cache tensor that now
                # requires grad, say): dynamo refuses to compile in this stance, before running anything. The
                # call goes through every guard below, compiling what it needs.
                if "skip_guard_eval_unsafe" not in str(error):
                    raise
                self.compiled.discard(key)
        # inductor reads its config when it compiles a width's graph (the first call at that width); later calls run
        # the graph dynamo cached for the width whatever the config says.
        patches = inductor_patches(self.gemm_for(tokens.shape[0]))
        with torch._dynamo.config.patch(
            recompile_limit=self._recompile_limit, accumulated_recompile_limit=max(256, 4 * self._recompile_limit),
            # Every call checks its graph's guards first: one per parameter and cache tensor (about 330 for
            # SmolLM2), 1.1 ms of a 25 ms step. With recursive dict tags, a module subtree whose dicts are
            # unchanged since the last check (no attribute, parameter or submodule set) skips its guards: 0.44 ms.
            # Anything that sets a parameter or module changes a tag and gets the full check.
            use_recursive_dict_tags_for_guards=True,
        ), (_inductor_config(patches) if patches else contextlib.nullcontext()):
            logits = self._decode(self.slot_model, tokens, slot_ids, positions, buffers)
        self.compiled.add(key)
        return logits

    def gemm_for(self, width: int) -> str:
        """The GEMM of this width's graph ("cpp" or "aten"), resolved once per width."""
        if width not in self.gemms:
            free = free_memory_bytes(self.device) if self.gemm == "auto" and not self.eager else None
            gemm = decode_gemm(self.gemm, self.device.type, self.backend, width, self.weights_dtype, free, self.weight_bytes)
            if gemm != decode_gemm(self.gemm, self.device.type, self.backend, width, self.weights_dtype):  # memory decided it
                log.info(f"decode width {width}: the library GEMM, not the C++ template: its packed copy of the weights "
                         f"(up to {template_copy_bytes(self.weight_bytes) / 2**30:.2g} GiB) does not fit in the "
                         f"{free / 2**30:.2g} GiB free")
            self.gemms[width] = gemm
        return self.gemms[width]

    def timed(self, tokens, slot_ids, positions, buffers) -> tuple[torch.Tensor, bool, float, float]:
        """(logits, compiled?, compile_s, step_s) of one decode call."""
        return timed_call(lambda: self(tokens, slot_ids, positions, buffers), self.compile_stats, self.device)

    def warm_up(self, widths: list[int], scratch_slot: int, buffers) -> int:
        """Compile each width now on padding rows only (the scratch slot); the number of graphs compiled."""
        graphs_before = self.compile_stats.graphs
        for index, width in enumerate(widths, 1):
            template = self.gemm_for(width) == "cpp"
            kernel = ", inductor's C++ GEMM template: max-autotune" if template else ""
            log.info(f"compiling decode width {width} ({index}/{len(widths)}{kernel}) ...")
            tokens = torch.zeros(width, 1, dtype=torch.int64, device=self.device)
            slot_ids = torch.full((width,), scratch_slot, dtype=torch.int64, device=self.device)
            positions = torch.zeros(width, dtype=torch.int64, device=self.device)
            self.timed(tokens, slot_ids, positions, buffers)
        return self.compile_stats.graphs - graphs_before


def _inductor_config(patches: dict):
    import torch._inductor.config as inductor_config

    return inductor_config.patch(patches)


__all__ = ["CompiledDecode"]
