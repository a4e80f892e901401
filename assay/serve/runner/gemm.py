"""Which GEMM runs a compiled decode step's linears, per device, compiler, weight dtype and width: inductor's
config for the graph of each width.

A decode step multiplies W = 1-64 rows by every weight of the model once: the weights' bytes, not the
FLOPs, set its floor. On an x86 CPU the library GEMMs inductor calls by default (MKL's sgemm for float32,
oneDNN for bfloat16) stream those bytes at 9-34% of the memory's read rate at such W, while inductor's C++
GEMM template (freezing, then max-autotune over the CPP backend) generates a micro-kernel for the shape and
the CPU. bench/serve/decode_gemm.py, one compiled decode step of SmolLM2-135M-Instruct, 2 threads, AVX-512
(docs/serve.md, "Which GEMM serves a compiled decode step"), template / library step time:
  float32   0.45 0.26 0.33 0.55 1.13 1.05   at widths 1 2 4 8 16 32
  bfloat16  0.51 0.54 0.64 0.85 0.87 0.98
  int8      0.62 0.59 0.65 0.98 0.98 1.00   (--quantize int8: the template's weight-only int8 micro-kernel)
On an Intel Xeon with AMX tiles (2 cores) the bfloat16 template uses AMX: 0.62 at width 8 and 0.77 at 32.

  auto  the C++ template for widths up to cpp_max_width(weights) on an x86 CPU under inductor (CPP_MAX_WIDTH,
        or CPP_MAX_WIDTH_AMX on a CPU with AMX tiles); the library GEMM elsewhere (wider steps, other
        devices, other compilers)
  cpp   the C++ template at every width (x86 CPU and inductor only)
  aten  the library GEMM at every width (inductor's default)

What the template costs: each width's graph is compiled with max-autotune (100-130 s per width for SmolLM2
on 2 cores, at warm-up, before the first request), and freezing gives each width's graph its own packed
copy of the weights (SmolLM2, 538 MB of float32 weights: RSS +0.84 GB after width 1, +1.39 GB more after
width 2; the library GEMM's graphs +0.16 GB, then +0.02 GB). So `auto` gives a width the template only while
3x the weights' bytes are free when that width compiles, and the library GEMM otherwise.
"""

from __future__ import annotations

import platform

from assay.core.errors import AssayError

DECODE_GEMMS = ("auto", "cpp", "aten")
# The widest step `auto` gives the template, per weight dtype: past it the template is slower (float32: 1.13x
# the library GEMM's step at 16) or too little faster to pay its compile and packed copy (bfloat16: 0.98x at 32;
# int8 weights, serve/runner/quantize.py: 0.98x from 8 on).
CPP_MAX_WIDTH = {"float32": 8, "bfloat16": 16, "int8": 4}
# The same on a CPU with AMX tiles, where the template's bfloat16 micro-kernel runs on them: its step 0.77x the
# library GEMM's (oneDNN) at width 32, where the AVX-512 CPU measured 0.98x. float32 and int8 do not use AMX.
CPP_MAX_WIDTH_AMX = CPP_MAX_WIDTH | {"bfloat16": 32}
# A width compiled through the template may add this many times the weights' bytes to the process (see
# template_copy_bytes): `auto` gives a width the template only while that much memory is free.
TEMPLATE_COPY_FACTOR = 3
# Freezing folds the weights into the graph (and packs them for the micro-kernel); max-autotune over the
# C++ template with aten's GEMM offered beside it keeps the faster of the two per shape. Its tables of
# choices (written to stderr for every shape by default) stay out of a server's log: the warm-up says which
# width it compiles, with which GEMM.
CPP_PATCHES = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
               "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


def check_decode_gemm(name: str) -> str:
    if name not in DECODE_GEMMS:
        raise AssayError(f"--decode-gemm must be one of {', '.join(DECODE_GEMMS)}, got {name!r}")
    return name


def cpp_template_available(device_type: str, backend: str | None) -> bool:
    """Whether inductor's C++ GEMM template can serve this device and compiler: inductor on an x86 CPU."""
    return backend == "inductor" and device_type == "cpu" and platform.machine().lower() in ("x86_64", "amd64")


def cpp_max_width(dtype: str, amx: bool | None = None) -> int:
    """The widest decode step `auto` gives the template for weights in `dtype`; amx: whether the CPU has AMX
    tiles (None: this CPU's answer)."""
    if amx is None:
        import torch

        amx = torch.cpu._is_amx_tile_supported()
    return (CPP_MAX_WIDTH_AMX if amx else CPP_MAX_WIDTH).get(dtype, 0)


def decode_gemm(choice: str, device_type: str, backend: str | None, width: int, dtype: str = "float32",
                free_bytes: int | None = None, weight_bytes: int = 0, amx: bool | None = None) -> str:
    """'cpp' or 'aten': the GEMM of the compiled decode graph of `width` rows with weights in `dtype`. AssayError
    when `choice` is cpp and the template cannot serve this device or compiler. free_bytes (the memory free
    now, None: unknown) and weight_bytes (the matmul weights'): `auto` keeps the library GEMM for a width
    whose packed copy of the weights (TEMPLATE_COPY_FACTOR x weight_bytes) would not fit. amx: as cpp_max_width's."""
    check_decode_gemm(choice)
    available = cpp_template_available(device_type, backend)
    if choice == "cpp" and not available:
        raise AssayError(f"--decode-gemm cpp needs the inductor backend on an x86 CPU (here: {backend or 'eager'} on "
                         f"{device_type}, {platform.machine()})")
    if choice == "aten" or not available:
        return "aten"
    if choice == "cpp":
        return "cpp"
    fits = free_bytes is None or template_copy_bytes(weight_bytes) <= free_bytes
    return "cpp" if width <= cpp_max_width(dtype, amx) and fits else "aten"


def template_copy_bytes(weight_bytes: int) -> int:
    """What compiling one width through the template may add to the process: freezing folds a packed copy of
    the weights into its graph (measured on SmolLM2's 538 MB: +0.84 GB at the first width, +1.39 GB at the
    second, so up to 2.6x the weights), TEMPLATE_COPY_FACTOR x the weights' bytes."""
    return TEMPLATE_COPY_FACTOR * weight_bytes


def inductor_patches(gemm: str) -> dict:
    """inductor's config for a decode graph served by `gemm`."""
    return dict(CPP_PATCHES) if gemm == "cpp" else {}


__all__ = ["CPP_MAX_WIDTH", "CPP_MAX_WIDTH_AMX", "cpp_max_width", "DECODE_GEMMS", "TEMPLATE_COPY_FACTOR", "check_decode_gemm", "decode_gemm", "inductor_patches",
           "template_copy_bytes"]
