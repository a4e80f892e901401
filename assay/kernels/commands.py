"""`assay kernels list|check|bench`: the registry, its numerical check and its benchmark. Flags in,
one function call, the result out (a table, or --json)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from assay.core.cli import device_option, dtype_option, json_option
from assay.core.dtypes import dtype_name, torch_dtype
from assay.core.errors import AssayError
from assay.core.values import comma_list

CHECK_COLUMNS = ["kernel", "case", "dtype", "impl", "tensor", "max_abs", "rel", "reference_rel", "max_abs_vs_torch", "tol", "ok"]
CHECK_HEADERS = {"max_abs": "max|d| f64", "rel": "rel f64", "reference_rel": "ref rel f64", "max_abs_vs_torch": "max|d| torch f32"}
BENCH_COLUMNS = ["kernel", "case", "dtype", "mode", "impl", "kernel_ms", "reference_ms", "speedup", "kernel_best_ms", "reference_best_ms", "speedup_best"]
DTYPES = ("float32", "bfloat16")  # aliases bf16, fp32 accepted


def _names(kernels: Optional[str]) -> list[str] | None:
    return list(comma_list("--kernels", kernels, required=False)) if kernels else None


def register(app: typer.Typer) -> None:
    kernels_app = typer.Typer(no_args_is_help=True, help="Custom kernels: the replacement registry, its check and benchmark.")
    app.add_typer(kernels_app, name="kernels")

    @kernels_app.command("list")
    def list_kernels(json_out: bool = json_option()):
        """Registered kernels: what each replaces, its implementations and shape constraints."""
        from assay.core.output import print_json, print_table
        from assay.kernels.registry import all_kernels

        rows = [
            {
                "kernel": k.name, "replaces": k.target.__name__, "impls": ", ".join(k.impls),
                "devices": ", ".join(f"{d}: {i}" for d, i in k.device_impls.items()) + f"; else {k.impls[0]}",
                "constraints": "; ".join(c.describe() for c in k.constraints) or "-", "summary": k.summary,
            }
            for k in all_kernels()
        ]
        if json_out:
            print_json(rows)
        else:
            print_table(rows, ["kernel", "replaces", "impls", "devices", "constraints", "summary"], title="registered kernels")

    @kernels_app.command("check")
    def check(
        kernels: Optional[str] = typer.Option(None, "--kernels", help="comma-separated kernel names (default: all)"),
        device: str = device_option(help="device to run the kernels on"),
        impl: Optional[str] = typer.Option(
            None, help="force 'torch' or 'triton' (triton on cpu runs under TRITON_INTERPRET=1: slow, small shapes)"
        ),
        json_out: bool = json_option(),
    ):
        """Every kernel vs its reference, forward and backward, float32 and bfloat16, vs float64; exit 1 on a failure."""
        if impl not in (None, "torch", "triton"):
            raise AssayError(f"--impl {impl!r}: expected torch or triton")
        if impl == "triton" and device.split(":")[0] == "cpu":
            # Read when the Triton kernels are first imported (below, lazily), so setting it here is in time.
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from assay.core.output import print_json, print_table
        from assay.kernels.check import check_kernels

        report = check_kernels(_names(kernels), device=device, impl=impl)
        if json_out:
            print_json(report.as_dict())
        else:
            rows = [row.__dict__ | {"ok": "PASS" if row.ok else "FAIL"} for row in report.rows]
            print_table(rows, CHECK_COLUMNS, headers=CHECK_HEADERS, styles={"ok": {"PASS": "green", "FAIL": "red"}},
                        title=f"kernels check on {report.device}" + (f" (impl forced: {impl})" if impl else ""))
            worst = ", ".join(f"{name} {value:.3g}" if value else f"{name} 0.0" for name, value in report.float32_max_abs_vs_torch().items())
            typer.echo(f"float32 kernel vs PyTorch float32 reference, max abs diff: {worst}")
            typer.echo(f"{len(report.rows) - len(report.failures)} passed, {len(report.failures)} failed")
        if not report.ok:
            raise typer.Exit(1)

    @kernels_app.command("bench")
    def bench(
        kernels: Optional[str] = typer.Option(None, "--kernels", help="comma-separated kernel names (default: all)"),
        device: str = device_option(help="device to run on"),
        dtype: str = dtype_option(help="float32 or bfloat16"),
        repeats: int = typer.Option(7, help="timed runs per measurement (median reported)"),
        warmup: int = typer.Option(2, help="runs before timing, not counted"),
        out: str = typer.Option("bench/results/kernels.json", help="JSON file to write ('' for none)"),
        json_out: bool = json_option(),
    ):
        """Each kernel vs its reference, forward and forward+backward: medians and speed-up ratios."""
        from assay.core.output import print_json, print_table
        from assay.kernels.bench import bench_kernels

        if dtype_name(dtype, DTYPES) is None:
            raise AssayError(f"--dtype {dtype!r}: expected float32 or bfloat16")
        if repeats < 1 or warmup < 0:
            raise AssayError("--repeats must be >= 1 and --warmup >= 0")
        target = Path(out) if out.strip() else None
        report = bench_kernels(_names(kernels), device=device, dtype=torch_dtype(dtype), warmup=warmup, repeats=repeats, out=target)
        if json_out:
            print_json(report.as_dict())
            return
        print_table([r.__dict__ for r in report.rows], BENCH_COLUMNS, headers={"speedup": "speedup (median)", "kernel_best_ms": "kernel best", "reference_best_ms": "ref best", "speedup_best": "speedup (best)"},
                    title=f"kernels bench on {report.device_name} ({report.threads} threads, median of {repeats} after {warmup} warm-up)")
        if target is not None:
            typer.echo(f"wrote {target}")
