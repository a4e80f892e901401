"""What the selftest runs: one part per check, each the real `assay` command (or a Python entry) with
its flags, its time limit, and a reader that turns the part's JSON output into a verdict.

A full run is sized for one GPU and about 8 minutes (issue 21); `--quick` is the same plan with tiny
sizes, for a CPU test or a first look at a new machine. Parts run in this order; a part whose
prerequisite failed is not run (the zoo feeds the probes, training and serving).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from assay.core.errors import AssayError

# Zoo entries the other parts use besides the probed models: the tokenizer and config that training
# starts from, and the fixed-state model the serving benchmark drives.
TRAIN_ENTRY, SERVE_ENTRY = "qwen3", "gla"
FULL_MODELS = ("qwen3", "gpt2", "mixtral")  # dense GQA with q/k-norm, learned positions, MoE
QUICK_MODELS = ("qwen3",)


@dataclass(frozen=True)
class Finding:
    """What a part's output says: `problem` is None when the part passed."""

    headline: str
    result: dict
    problem: str | None = None


@dataclass(frozen=True)
class Part:
    name: str
    argv: tuple[str, ...]  # after the Python executable: ("-m", "assay", "probe", ...)
    timeout_s: float
    read: Callable[[object], Finding]  # the part's JSON stdout -> its finding
    needs: tuple[str, ...] = ()  # parts that must have PASSED first
    files: tuple[str, ...] = ()  # result files it writes besides its stdout JSON, relative to the out folder


@dataclass(frozen=True)
class Sizes:
    """Everything a quick run shrinks."""

    new_tokens: int
    kernels: tuple[str, ...] | None  # None: every registered kernel
    train: tuple[str, ...]
    gla_lengths: str
    gla_repeats: int
    serve: tuple[str, ...]
    timeouts: Mapping[str, float]
    budget_s: float


FULL = Sizes(
    new_tokens=32,
    kernels=None,
    # A real size (Qwen3-0.6B's shape, random init) so the MFU means something; the zoo checkpoint gives the tokenizer.
    train=("--flavour", "0.6B", "--steps", "20", "--batch", "8", "--seq-len", "1024"),
    gla_lengths="4096,16384",
    gla_repeats=3,
    serve=("--arrivals", "fixed", "--concurrency", "64", "--requests", "128", "--prompt-tokens", "128", "--max-tokens", "64",
           "--buckets", "1,2,4,8,16,32,64", "--max-seqs", "64"),
    timeouts={"stack": 60, "zoo": 120, "probe": 150, "kernels": 240, "train": 180, "gla": 120, "serve": 240},
    budget_s=480,
)
QUICK = Sizes(
    new_tokens=8,
    kernels=("rope",),
    train=("--steps", "3", "--batch", "2", "--seq-len", "64"),
    gla_lengths="256,1024",
    gla_repeats=1,
    serve=("--arrivals", "fixed", "--concurrency", "4", "--requests", "4", "--prompt-tokens", "16", "--max-tokens", "4",
           "--buckets", "1,2,4", "--max-seqs", "4"),
    timeouts={"stack": 60, "zoo": 120, "probe": 120, "kernels": 120, "train": 120, "gla": 60, "serve": 120},
    budget_s=300,
)


@dataclass(frozen=True)
class SelftestRequest:
    out: Path
    device: str = "cpu"
    quick: bool = False
    backend: str | None = None  # None: inductor, or aot_eager for a quick run on the CPU
    models: tuple[str, ...] | None = None  # zoo entries to probe (None: FULL_MODELS or QUICK_MODELS)
    parts: tuple[str, ...] | None = None  # names or groups ("probe") to run; None: all
    timeouts: Mapping[str, float] = field(default_factory=dict)  # per part or group, seconds
    budget_s: float | None = None  # the whole run; None: the size's
    zoo: Path | None = None  # where the zoo entries are built (existing ones are reused); None: out/zoo
    progress: bool = True

    @property
    def sizes(self) -> Sizes:
        return QUICK if self.quick else FULL

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def compile_backend(self) -> str:
        if self.backend:
            return self.backend
        # Inductor on a 2-core CPU costs minutes per model; a quick CPU run checks the plumbing, not the compiler.
        return "aot_eager" if self.quick and self.device_type == "cpu" else "inductor"

    @property
    def probe_models(self) -> tuple[str, ...]:
        return self.models or (QUICK_MODELS if self.quick else FULL_MODELS)

    @property
    def zoo_dir(self) -> Path:
        return self.zoo or self.out / "zoo"

    @property
    def total_budget_s(self) -> float:
        return self.budget_s if self.budget_s is not None else self.sizes.budget_s


def group(name: str) -> str:
    """probe-qwen3 -> probe: flags that name a group apply to each of its parts."""
    return name.split("-", 1)[0]


def plan(request: SelftestRequest) -> list[Part]:
    """Every part of the run, in order, with its time limit; `--parts` (plus what those parts need) and
    `--timeouts` applied."""
    sizes, device, backend, zoo = request.sizes, request.device, request.compile_backend, request.zoo_dir
    assay = ("-m", "assay")

    def part(name: str, argv: tuple[str, ...], read: Callable[[object], Finding], **extra) -> Part:
        timeout = request.timeouts.get(name, request.timeouts.get(group(name), sizes.timeouts[group(name)]))
        return Part(name, argv, float(timeout), read, **extra)

    entries = dict.fromkeys((*request.probe_models, TRAIN_ENTRY, SERVE_ENTRY))
    parts = [
        part("stack", (*assay, "stack", "--device", device, "--backend", backend, "--json"), read_stack),
        part("zoo", (*assay, "zoo", "build", str(zoo), "--only", ",".join(entries), "--json"), read_zoo),
    ]
    parts += [
        part(f"probe-{model}", (*assay, "probe", str(zoo / model), "--device", device, "--backend", backend,
                                "--out", str(request.out / "results"), "--new-tokens", str(sizes.new_tokens), "--json"),
             read_probe, needs=("zoo",), files=("results",))
        for model in request.probe_models
    ]
    kernels = ("--kernels", ",".join(sizes.kernels)) if sizes.kernels else ()
    # Real Triton where Triton targets the device; elsewhere the registry's default for it (its Triton
    # versions run on the CPU only in the interpreter, which tests/kernels covers).
    impl = ("--impl", "triton") if request.device_type == "cuda" else ()
    parts.append(part("kernels", (*assay, "kernels", "check", "--device", device, *impl, *kernels, "--json"), read_kernels))
    parts.append(part(
        "train", (*assay, "train", "--model", str(zoo / TRAIN_ENTRY), "--path", "native", "--kernels", "rope,attention",
                  "--dtype", "bfloat16", "--device", device, *sizes.train, "--metrics", str(request.out / "train_metrics.jsonl"), "--json"),
        read_train, needs=("zoo",), files=("train_metrics.jsonl",),
    ))
    parts.append(part("gla", ("-m", "assay.selftest.gla_check", "--device", device, "--lengths", sizes.gla_lengths,
                              "--repeats", str(sizes.gla_repeats)), read_gla))
    parts.append(part(
        "serve", (*assay, "serve-bench", "--model", str(zoo / SERVE_ENTRY), "--device", device, "--backend", backend, "--modes", "buckets",
                  *sizes.serve, "--plot", str(request.out / "serve.png"), "--json"),
        read_serve, needs=("zoo",), files=("serve.png",),
    ))
    names = [p.name for p in parts]
    _check_names("--parts", request.parts or (), names)
    _check_names("--timeouts", request.timeouts, names)
    if not request.parts:
        return parts
    chosen = [p for p in parts if p.name in request.parts or group(p.name) in request.parts]
    needed = {name for p in chosen for name in p.needs}  # `--parts train` builds (or finds) its zoo entry first
    return [p for p in parts if p in chosen or p.name in needed]


def _check_names(flag: str, given, names: list[str]) -> None:
    known = set(names) | {group(name) for name in names}
    unknown = [name for name in given if name not in known]
    if unknown:
        raise AssayError(f"{flag}: unknown part {unknown[0]!r} (parts: {', '.join(names)}; a group such as 'probe' names all of its parts)")


def parse_timeouts(text: str | None) -> dict[str, float]:
    """ "gla=0.5,probe=60" -> {"gla": 0.5, "probe": 60.0}; AssayError on a bad item."""
    from assay.core.values import comma_list

    timeouts = {}
    for item in comma_list("--timeouts", text, required=False):
        name, _, seconds = item.partition("=")
        try:
            value = float(seconds)
        except ValueError:
            value = math.nan
        if not name.strip() or not value > 0 or math.isinf(value):
            raise AssayError(f"--timeouts {text!r}: {item!r} is not PART=SECONDS with positive seconds")
        timeouts[name.strip()] = value
    return timeouts


# ---------------------------------------------------------------- readers: a part's JSON -> its finding


def read_stack(stack: dict) -> Finding:
    result = {key: stack.get(key) for key in ("stack_id", "label", "device_type", "device_count", "device_name", "backend", "python")}
    result |= {"torch": stack["libraries"].get("torch"), "transformers": stack["libraries"].get("transformers"),
               "compiler": stack.get("compiler")}
    problem = None if stack.get("device_count") else f"no {stack.get('device_type')} device visible"
    return Finding(stack["label"], result, problem)


def read_zoo(rows: list) -> Finding:
    return Finding(f"{len(rows)} checkpoints", {"entries": [row["entry"] for row in rows]})


def read_probe(row: dict) -> Finding:
    keep = ("model", "status", "reason", "device", "backend", "dtype", "stack_id", "load_s", "compile_s", "decode_tokens_per_s",
            "total_s", "peak_memory_bytes", "graphs", "graph_breaks", "recompiles")
    result = {key: row.get(key) for key in keep}
    headline = f"{row['status']}: compile {_num(row.get('compile_s'))} s, decode {_num(row.get('decode_tokens_per_s'))} tok/s"
    problem = None if row["status"] == "PASS" else f"{row['status']}: {row.get('reason')}"
    return Finding(headline, result, problem)


def read_kernels(report: dict) -> Finding:
    rows = report["rows"]
    failed = [row for row in rows if not row["ok"]]
    result = {
        "ok": report["ok"], "checks": report["checks"], "failed": report["failed"], "device": report["device"],
        "forced_impl": report["forced_impl"], "impls": sorted({f"{row['kernel']}: {row['impl']}" for row in rows}),
        "dtypes": sorted({row["dtype"] for row in rows}), "float32_max_abs_vs_torch": report["float32_max_abs_vs_torch"],
        "failures": failed[:20],
    }
    headline = f"{report['checks'] - report['failed']}/{report['checks']} checks passed ({', '.join(result['impls'])})"
    problem = None
    if failed:
        worst = max(failed, key=lambda row: row["rel"] / row["tol"] if row["tol"] else math.inf)
        problem = (f"{len(failed)} of {report['checks']} checks failed; worst: {worst['kernel']} {worst['case']} {worst['dtype']} "
                   f"{worst['tensor']} rel {worst['rel']:.3g} > tol {worst['tol']:.1g}")
    return Finding(headline, result, problem)


def read_train(payload: dict) -> Finding:
    summary = payload["summary"]
    keep = ("model", "path", "device", "device_name", "dtype", "batch", "seq_len", "steps_run", "first_loss", "final_loss",
            "warmup_s", "steady_steps", "steady_step_s_mean", "steady_tokens_per_s", "steady_mfu", "peak_flops", "peak_flops_source",
            "params_total", "flops_per_token", "peak_memory_bytes")
    result = {key: summary.get(key) for key in keep} | {"kernels": payload.get("kernels")}
    mfu = summary.get("steady_mfu")
    if summary.get("peak_flops"):
        of_peak = f"MFU {100 * (mfu or 0):.1f}% of {summary['peak_flops'] / 1e12:,.0f} TFLOP/s ({summary['peak_flops_source']})"
    else:
        of_peak = "MFU - (no peak table entry for this device)"
    headline = f"{_num(summary.get('steady_tokens_per_s'))} tok/s, {of_peak}"
    final = summary.get("final_loss")
    problem = None if final is not None and math.isfinite(final) else f"no finite final loss ({final})"
    return Finding(headline, result, problem)


def read_gla(payload: dict) -> Finding:
    rows = payload["rows"]
    headline = "; ".join(f"T={row['T']}: chunk {row['speedup']:.1f}x recurrent, rel {row['chunk_rel_error']:.1e}" for row in rows)
    bad = [row for row in rows if not row["ok"]]
    problem = None
    if bad:
        row = bad[0]
        problem = (f"T={row['T']}: relative error vs float64 chunk {row['chunk_rel_error']:.3g}, "
                   f"recurrent {row['recurrent_rel_error']:.3g} > tol {row['tol']:.1g}")
    return Finding(headline, payload, problem)


def read_serve(payload: dict) -> Finding:
    run = payload["runs"][0]
    summary = run["summary"]
    result = summary | {"requests_sent": run["requests_sent"], "requests_finished": run["requests_finished"], "timed_out": run["timed_out"],
                        "device": payload["device"], "model_type": payload["model_type"]}
    headline = (f"compile share {100 * summary['compile_share']:.1f}%, {_num(summary['tokens_per_s'])} tok/s, "
                f"TTFT p50 {_ms(summary['ttft_p50'])}, TPOT p50 {_ms(summary['tpot_p50'])}")
    problem = None
    if run["timed_out"] or run["requests_finished"] < run["requests_sent"]:
        problem = f"{run['requests_finished']} of {run['requests_sent']} requests finished" + (" (time limit)" if run["timed_out"] else "")
    return Finding(headline, result, problem)


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.3g} ms"
