"""torch.compile by backend name, with the counters that say what compilation did.

Every compiled call site in assay goes through `compile_fn`, so graphs, graph breaks, recompiles
and compile-cache hits are counted the same way in the probe, the trainer and the server.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from assay.core.device import resolve_backend
from assay.core.errors import AssayError

# torch.compile modes assay passes on (inductor only). "max-autotune-no-cudagraphs" benchmarks GEMM
# choices (on CPU: aten and inductor's C++ GEMM template, which it only offers for constant weights,
# i.e. frozen inference graphs, not training) and is reported in docs/training.md.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")


@dataclass
class CompileStats:
    """What dynamo did while this object was counting.

    graphs: FX graphs handed to the backend (one per compiled region; a graph break adds one);
    recompiles: graphs compiled again for a frame already compiled (guards failed: new shape, dtype...);
    graph_breaks: dynamo's graph-break counter delta, with the reasons;
    cache_hits / cache_misses: inductor FX-graph cache and AOT-autograd cache lookups.
    """

    graphs: int = 0
    recompiles: int = 0
    graph_breaks: int = 0
    break_reasons: list[str] = field(default_factory=list)
    cache_hits: int = 0
    cache_misses: int = 0
    compile_ids: list[str] = field(default_factory=list)

    @property
    def cache_hit(self) -> bool | None:
        """True when every lookup hit, False when any missed, None when the backend keeps no cache."""
        if self.cache_hits + self.cache_misses == 0:
            return None
        return self.cache_misses == 0

    def as_dict(self) -> dict:
        return {
            "graphs": self.graphs,
            "recompiles": self.recompiles,
            "graph_breaks": self.graph_breaks,
            "break_reasons": self.break_reasons,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
        }


def mode_config_patches(backend: str, mode: str | None) -> dict:
    """Inductor config patches of a torch.compile mode ({} for the default); AssayError for an unknown mode
    or a mode on another backend."""
    if mode in (None, "default"):
        return {}
    if mode not in COMPILE_MODES:
        raise AssayError(f"unknown compile mode {mode!r}; choose one of {', '.join(COMPILE_MODES)}")
    if backend != "inductor":
        raise AssayError(f"compile mode {mode!r} needs the inductor backend, not {backend!r}")
    import torch._inductor

    return torch._inductor.list_mode_options(mode)


def counting_backend(backend: str, stats: CompileStats, config_patches: dict | None = None) -> Callable:
    """The backend named `backend` (with inductor `config_patches`, when given), counting into `stats`."""
    import torch._dynamo
    from torch._guards import CompileContext

    inner = torch._dynamo.lookup_backend(backend)
    extra = {"config_patches": config_patches} if config_patches else {}

    def backend_fn(gm: torch.fx.GraphModule, example_inputs):
        compile_id = CompileContext.current_compile_id()
        stats.graphs += 1
        if compile_id is not None:
            stats.compile_ids.append(str(compile_id))
            if getattr(compile_id, "frame_compile_id", 0):
                stats.recompiles += 1
        return inner(gm, example_inputs, **extra)

    backend_fn.__name__ = f"counted_{backend}"
    return backend_fn


def timed_call(call: Callable[[], Any], stats: CompileStats, device) -> tuple[Any, bool, float, float]:
    """call() under no_grad, the device synchronised around it: (its result, whether it compiled a graph (counted
    in `stats`), dynamo's compile seconds inside it, the call's seconds). The compile time is dynamo's own timer
    (`_compile.compile_inner`), clamped to the call, which contains it."""
    from time import perf_counter

    from assay.core.device import synchronize

    graphs_before = stats.graphs
    compile_before = _compile_seconds()
    synchronize(device)
    start = perf_counter()
    with torch.no_grad(), watch(stats):
        result = call()
    synchronize(device)
    seconds = perf_counter() - start
    compiled = stats.graphs > graphs_before
    compile_s = 0.0
    if compiled:
        compile_s = min(max(0.0, _compile_seconds() - compile_before), seconds)
    return result, compiled, compile_s, seconds


def fresh_function(fn: Callable) -> Callable:
    """A copy of `fn` with its own code object. Dynamo keeps compiled graphs per code object, so each caller
    that compiles a copy gets its own cache: its compile count starts at zero and two engines in one process
    (tests, a benchmark's modes) never share or evict each other's graphs."""
    import types

    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def compile_fn(fn: Callable, backend: str, stats: CompileStats | None = None, mode: str | None = None, **kwargs) -> Callable:
    """torch.compile(fn) with the backend named `backend` and `mode` (COMPILE_MODES), counting graphs/recompiles into `stats`."""
    backend = resolve_backend(backend)
    patches = mode_config_patches(backend, mode)
    if stats is None:
        return torch.compile(fn, backend=backend, options=patches or None, **kwargs)
    return torch.compile(fn, backend=counting_backend(backend, stats, patches), **kwargs)


def compile_modules(
    modules, backend: str, stats: CompileStats | None = None, wrap: Callable | None = None, mode: str | None = None, **kwargs
) -> None:
    """Compile each module's forward in place (state-dict keys unchanged), one compiled function per class.

    Modules of one class share one torch.compile of the unbound forward, so N identical transformer
    blocks compile once: a separate torch.compile per block would recompile for every block (each
    brings its own backend callable) and hit dynamo's recompile limit past 8 layers. Hooks (FSDP's
    all-gathers) stay outside the compiled region. `wrap(forward) -> forward`, when given, is applied to
    the class's forward before compiling (the trainer's activation checkpointing, traced with the block).
    """
    import types

    compiled_by_class: dict[type, Callable] = {}
    for module in modules:
        cls = type(module)
        if cls not in compiled_by_class:
            forward = wrap(cls.forward) if wrap is not None else cls.forward
            compiled_by_class[cls] = compile_fn(forward, backend, stats, mode, **kwargs)
        module.forward = types.MethodType(compiled_by_class[cls], module)


def _dynamo_utils():
    """torch._dynamo.utils if this process has imported it, else None. Reading dynamo's counters must not import
    dynamo (about 1.3 CPU-seconds): a process that never imported it has compiled nothing, and one that
    imports it inside a watched block starts its counters from zero there."""
    return sys.modules.get("torch._dynamo.utils")


def _counters() -> defaultdict:
    utils = _dynamo_utils()
    return utils.counters if utils is not None else defaultdict(Counter)


def _compile_seconds() -> float:
    utils = _dynamo_utils()
    return 0.0 if utils is None else sum(utils.compilation_time_metrics.get("_compile.compile_inner", []))


def _counter_snapshot() -> dict[str, int]:
    counters = _counters()
    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "hits": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
        "misses": counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["autograd_cache_miss"],
    }


@contextlib.contextmanager
def watch(stats: CompileStats) -> Iterator[CompileStats]:
    """Add dynamo's global counter deltas over the block (graph breaks, cache lookups) to `stats`."""
    before = _counter_snapshot()
    reasons_before = dict(_counters()["graph_break"])
    try:
        yield stats
    finally:
        after = _counter_snapshot()
        stats.graph_breaks += after["graph_breaks"] - before["graph_breaks"]
        stats.cache_hits += after["hits"] - before["hits"]
        stats.cache_misses += after["misses"] - before["misses"]
        for reason, count in _counters()["graph_break"].items():
            if count > reasons_before.get(reason, 0):
                stats.break_reasons.append(reason.splitlines()[0][:300])


def reset() -> None:
    """Forget compiled code so the next call compiles again (between independent measurements)."""
    import torch._dynamo

    torch._dynamo.reset()
