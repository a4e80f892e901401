"""Training throughput and MFU per model path (hf, native, native+kernels, native+compile) at three
dense sizes and the zoo's MoE, plus the memory of the chunked loss and of activation checkpointing, on CPU.

    python bench/train_bench.py            -> bench/results/train.json, bench/results/train.png, a table

Sizes: `tiny` (the zoo's qwen3: 2 layers, hidden 64), `small` (4 layers, hidden 256), `8x512` (8 layers,
hidden 512, the Transformers baseline of measured-here.md) and `moe` (the zoo's qwen3-moe: 8 experts,
top-2); the zoo's 1,024-token vocabulary, batch 4 x 512 tokens, float32, AdamW. Every path runs through
the same trainer (assay.train.Trainer), so loss, optimizer, data and timing are identical; only the
model code differs.

The machine is shared, so within a size the paths' trainers are interleaved step by step (the order
rotates every step): neighbouring steps see the same load, and each step index gives a ratio against
hf. The first `--timing-warmup` steps of each trainer (compilation for native+compile) are excluded
and reported apart. Headline per path: the median of its per-step ratios to hf, with their min-max.
MFU is against the fp32 matmul peak measured in this run (core.metrics.measure_peak_flops, before and
after the steps; the higher is used), with core.metrics.train_flops_per_token (through the trainer).

Memory (fresh subprocess per setting, peak RSS growth over the training steps): the loss at Qwen3's
151,936-token vocabulary with the full logits vs in chunks, and --activation-checkpointing
none/full/selective at the small size (their speed interleaved in this process).
Kernels: grouped_experts against the reference expert loop at the zoo MoE's shapes, forward+backward.
`--profile` writes torch.profiler's per-op table of one steady step (`--profile-size`, `--profile-paths`, default hf and
native) and the step's self CPU time by kind (matmul, SDPA, compiled graphs, optimizer, other) to the JSON.
Issue 17's third pass at --compile (docs/training.md): `--paths` also takes `native+compile-autotune` (--compile-mode
max-autotune-no-cudagraphs) and `native+compile-levers` (blocked attention and fused gate/up patched into the blocks);
`--levers` times inductor's C++ GEMM template against aten per 8x512 GEMM shape and one compiled 8x512 block's
variants (fused q/k/v, fused gate/up, blocked attention), with the block's per-kernel profile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from assay.core.files import atomic_write_json
from assay.core.metrics import measure_peak_flops, new_figure, save_figure
from assay.core.output import print_table
from assay.train import OptimConfig, TrainRequest
from assay.train.records import phase_mfu, phase_tokens_per_s, steady_records
from assay.train.trainer import Trainer
from assay.zoo.tokenizer import TOKEN_IDS

RESULTS = Path(__file__).resolve().parent / "results"
BATCH, SEQ_LEN = 4, 512
DENSE = dict(max_position_embeddings=2048, tie_word_embeddings=False, **TOKEN_IDS)
WRITTEN_SIZES = {  # sizes the zoo does not have, written here with a fixed seed
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "8x512": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64),
    # 8x512's block, 2 layers: a quick look at a compile option before paying for 8x512
    "2x512": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, head_dim=64),
}
SIZES = ("tiny", "small", "8x512", "moe")
ZOO_SIZES = {"tiny": "qwen3", "moe": "qwen3-moe"}
PATHS = ("hf", "native", "native+kernels", "native+compile")
# Run only when named in --paths: --compile with mode max-autotune-no-cudagraphs (GEMM choices benchmarked at
# compile); --compile with two of the --levers variants patched into the blocks (blocked attention, fused gate/up:
# an experiment of this bench, not a trainer option).
EXTRA_PATHS = ("native+compile-autotune", "native+compile-levers")
COMPILE_MODE = {"native+compile-autotune": "max-autotune-no-cudagraphs"}
KERNELS = {"dense": ("rope", "attention"), "moe": ("rope", "grouped_experts", "attention")}
QWEN3_VOCAB = 151_936
TARGETS = {"native": 1.0, "native+compile@8x512": 1.2, "compile_mfu_fraction_of_peak": 0.6}


def write_checkpoint(folder: Path, config: dict, vocab_size: int | None = None) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from assay.zoo.tokenizer import VOCAB_SIZE, write_tokenizer

    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab_size or VOCAB_SIZE, **DENSE, **config)).save_pretrained(folder)
    write_tokenizer(folder)
    return folder


def checkpoints(scratch: Path, sizes) -> dict[str, Path]:
    from assay.zoo import build_zoo

    zoo_names = [ZOO_SIZES[size] for size in sizes if size in ZOO_SIZES]
    if zoo_names:
        build_zoo(scratch / "zoo", zoo_names, progress=False)
    return {
        size: scratch / "zoo" / ZOO_SIZES[size] if size in ZOO_SIZES else write_checkpoint(scratch / size, WRITTEN_SIZES[size])
        for size in sizes
    }


def request(checkpoint: Path, path: str, steps: int, warmup: int, peak: float, **extra) -> TrainRequest:
    model_path = "hf" if path == "hf" else "native"
    kernels = KERNELS["moe" if "moe" in checkpoint.name else "dense"] if path == "native+kernels" else None
    return TrainRequest(
        model=str(checkpoint), path=model_path, kernels=kernels, compile=path.startswith("native+compile"), backend="inductor",
        compile_mode=COMPILE_MODE.get(path, "default"),
        steps=steps, batch=BATCH, seq_len=SEQ_LEN, optim=OptimConfig(lr=3e-4, warmup_steps=1), peak_flops=str(peak),
        timing_warmup_steps=warmup, **extra,
    )


def interleave(trainers: dict[str, Trainer], steps: int) -> None:
    names = list(trainers)
    for step in range(steps):
        shift = step % len(names)
        for name in names[shift:] + names[:shift]:  # rotate the order: no path always runs first
            trainers[name].step(step)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def run_size(size: str, checkpoint: Path, paths, steps: int, warmup: int, peak: float) -> dict:
    started = time.perf_counter()
    trainers = {path: Trainer(request(checkpoint, path, steps, warmup, peak)) for path in paths}
    if "native+compile-levers" in trainers:  # patched before the first step, which traces the blocks
        apply_levers(trainers["native+compile-levers"].loaded.blocks())
    set_up_s = time.perf_counter() - started
    try:
        interleave(trainers, steps)
        summaries = {path: trainer.summary() for path, trainer in trainers.items()}
        records = {path: trainer.records for path, trainer in trainers.items()}
    finally:
        for trainer in trainers.values():
            trainer.close()
    steady = {path: steady_records(records[path]) for path in paths}
    result = {"checkpoint": checkpoint.name, "set_up_s": set_up_s, "paths": {}}
    for path in paths:
        summary = summaries[path]
        entry = {
            "steady_tokens_per_s": phase_tokens_per_s(steady[path]), "steady_mfu": phase_mfu(steady[path]),
            "step_tokens_per_s": spread([r["tokens_per_s"] for r in steady[path]]),
            "warmup_s": summary["warmup_s"], "steady_steps": len(steady[path]), "step_s": [r["step_s"] for r in records[path]],
            "losses": [r["loss"] for r in records[path]], "first_loss": summary["first_loss"],
            "flops_per_token": summary["flops_per_token"], "active_matmul_params": summary["active_matmul_params"],
            "optimizer_implementation": summary["optimizer_implementation"], "compile": summary["compile"],
        }
        if path != "hf":
            ratios = [p["tokens_per_s"] / h["tokens_per_s"] for p, h in zip(steady[path], steady["hf"])]
            entry["over_hf_step_ratios"] = ratios
            entry["over_hf"] = spread(ratios)
            entry["first_loss_rel_diff_vs_hf"] = abs(summary["first_loss"] - summaries["hf"]["first_loss"]) / summaries["hf"]["first_loss"]
        result["paths"][path] = entry
    return result


# ---------------------------------------------------------------- memory (fresh processes)

_MEMORY_CHILD = r"""
import json, resource, sys, time, torch
from assay.train import OptimConfig, TrainRequest
from assay.train.trainer import Trainer
torch.set_num_threads(int(sys.argv[4]))
kwargs = json.loads(sys.argv[2])
trainer = Trainer(TrainRequest(model=sys.argv[1], steps=int(sys.argv[3]), optim=OptimConfig(lr=3e-4, warmup_steps=1), **kwargs))
before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
for step in range(int(sys.argv[3])):
    trainer.step(step)
elapsed = time.perf_counter() - started
after_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_rss_growth_bytes": (after_kib - before_kib) * 1024, "peak_rss_bytes": after_kib * 1024,
                  "losses": [r["loss"] for r in trainer.records], "step_s": [r["step_s"] for r in trainer.records],
                  "loss_chunk_tokens": trainer.loss_chunk_tokens, "wall_s": elapsed}))
trainer.close()
"""


def memory_run(checkpoint: Path, steps: int, threads: int, **kwargs) -> dict:
    """Peak RSS growth of `steps` training steps in a fresh process (the allocator's history is its own)."""
    completed = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, str(checkpoint), json.dumps(kwargs), str(steps), str(threads)],
        capture_output=True, text=True, check=True, env=os.environ | {"TRANSFORMERS_VERBOSITY": "error"},
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def chunked_loss_memory(scratch: Path, threads: int) -> dict:
    """Qwen3's vocabulary on a 2-layer hidden-256 model, batch 2 x 512: the full fp32 logits are 622 MB."""
    checkpoint = write_checkpoint(scratch / "vocab151936", dict(WRITTEN_SIZES["small"], num_hidden_layers=2), vocab_size=QWEN3_VOCAB)
    common = dict(batch=2, seq_len=512, path="native")
    full = memory_run(checkpoint, 2, threads, loss_chunk_tokens=0, **common)
    chunked = memory_run(checkpoint, 2, threads, **common)  # automatic chunking
    return {
        "config": {"vocab_size": QWEN3_VOCAB, "layers": 2, "hidden": 256, "batch": 2, "seq_len": 512, "path": "native"},
        "full_logits_fp32_bytes": 2 * 512 * QWEN3_VOCAB * 4,
        "full": full, "chunked": chunked,
        "peak_growth_saved_bytes": full["peak_rss_growth_bytes"] - chunked["peak_rss_growth_bytes"],
        "first_loss_rel_diff": abs(full["losses"][0] - chunked["losses"][0]) / full["losses"][0],
    }


def activation_checkpointing(checkpoint: Path, steps: int, warmup: int, peak: float, threads: int) -> dict:
    modes = ("none", "full", "selective")
    memory = {mode: memory_run(checkpoint, 2, threads, path="native", batch=BATCH, seq_len=SEQ_LEN, activation_checkpointing=mode)
              for mode in modes}
    trainers = {mode: Trainer(request(checkpoint, "native", steps, warmup, peak, activation_checkpointing=mode)) for mode in modes}
    try:
        interleave(trainers, steps)
        steady = {mode: steady_records(trainer.records) for mode, trainer in trainers.items()}
        losses = {mode: [r["loss"] for r in trainer.records] for mode, trainer in trainers.items()}
    finally:
        for trainer in trainers.values():
            trainer.close()
    return {
        mode: {
            "peak_rss_growth_bytes": memory[mode]["peak_rss_growth_bytes"],
            "steady_tokens_per_s": phase_tokens_per_s(steady[mode]),
            "over_none": spread([m["tokens_per_s"] / n["tokens_per_s"] for m, n in zip(steady[mode], steady["none"])]),
            "first_loss": losses[mode][0],
        }
        for mode in modes
    } | {"size": checkpoint.name}


# ---------------------------------------------------------------- grouped experts vs the reference loop


def grouped_experts_vs_loop(repeats: int) -> dict:
    from assay.kernels.grouped_experts import KERNEL, KernelGroupedExperts
    from assay.kernels.registry import Case
    from assay.models.layers import GroupedExperts

    sizes = dict(tokens=BATCH * SEQ_LEN, dim=64, hidden=32, experts=8, top_k=2)  # the zoo MoE's experts at this batch
    inputs = KERNEL.make_inputs(Case("zoo", sizes), torch.float32, torch.Generator().manual_seed(0))
    reference = GroupedExperts(sizes["experts"], sizes["dim"], sizes["hidden"])
    reference.use_grouped_mm = False  # the per-expert loop
    with torch.no_grad():
        for name in ("w1", "w2", "w3"):
            getattr(reference, name).copy_(inputs[name])
    modules = {"reference_loop": reference, "grouped_experts": KernelGroupedExperts.from_module(reference)}
    times: dict[str, list[float]] = {name: [] for name in modules}
    x = inputs["x"].requires_grad_()
    for repeat in range(repeats + 2):
        for name, module in (modules.items() if repeat % 2 == 0 else reversed(modules.items())):
            started = time.perf_counter()
            module(x, inputs["top_k_index"], inputs["top_k_weights"]).sum().backward()
            if repeat >= 2:  # two warm-up rounds
                times[name].append(time.perf_counter() - started)
            reference.zero_grad(set_to_none=True)
            x.grad = None
    ratios = [r / k for r, k in zip(times["reference_loop"], times["grouped_experts"])]
    return {
        "shapes": sizes, "forward_backward_s": {name: spread(values) for name, values in times.items()},
        "speedup_over_loop": spread(ratios), "not_slower": statistics.median(ratios) >= 1.0,
    }


# ---------------------------------------------------------------- levers at 8x512 (issue 17's third pass)


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def gemm_template_vs_aten(repeats: int) -> dict:
    """Inductor's C++ GEMM template (max-autotune, backend CPP only) against aten's mm at 8x512's GEMM shapes.

    In a training graph inductor offers the template for mm/addmm only when the weight is a constant
    (`use_cpp_gemm_template(require_constant_mat2=True)`: frozen inference), so for training it never runs;
    bmm is offered it with any weight, so each shape goes through a batch-1 bmm here to time the template
    itself, alone and with a residual-add epilogue fused (against aten's mm + add). Forward shapes and the
    input-gradient shapes of one block at batch 4 x 512.
    """
    from torch._dynamo.utils import counters

    tokens, dim, hidden, kv = BATCH * SEQ_LEN, 512, 1536, 256
    shapes = {"q/o proj": (tokens, dim, dim), "k/v proj": (tokens, dim, kv), "gate/up proj": (tokens, dim, hidden),
              "down proj": (tokens, hidden, dim), "grad down input": (tokens, dim, hidden), "grad gate/up input": (tokens, hidden, dim)}
    options = {"max_autotune": True, "max_autotune_gemm_backends": "CPP"}
    results = {}
    for name, (m, k, n) in shapes.items():
        # b as F.linear takes a weight: [n, k], transposed (dynamic=False: one lambda, several shapes, and the
        # template needs static n and k)
        a, b, residual = torch.randn(m, k), torch.randn(n, k), torch.randn(m, n)
        template = torch.compile(lambda a, b: torch.bmm(a[None], b.t()[None])[0], backend="inductor", options=options, dynamic=False)
        fused = torch.compile(lambda a, b, r: r + torch.bmm(a[None], b.t()[None])[0], backend="inductor", options=options, dynamic=False)
        before = counters["inductor"]["select_algorithm_autotune"]
        started = time.perf_counter()
        template(a, b), fused(a, b, residual)
        compile_s = time.perf_counter() - started
        runs = {"aten_mm": lambda: torch.mm(a, b.t()), "template": lambda: template(a, b),
                "aten_mm_add": lambda: residual + torch.mm(a, b.t()), "template_add_fused": lambda: fused(a, b, residual)}
        times: dict[str, list[float]] = {key: [] for key in runs}
        for repeat in range(repeats):
            for key, run in (runs.items() if repeat % 2 == 0 else reversed(runs.items())):
                started = time.perf_counter()
                run()
                times[key].append(time.perf_counter() - started)
        results[name] = {
            "m_k_n": [m, k, n], "compile_s": compile_s, "autotuned": counters["inductor"]["select_algorithm_autotune"] - before,
            "ms": {key: _median_ms(values) for key, values in times.items()},
            "template_over_aten": statistics.median(times["aten_mm"]) / statistics.median(times["template"]),
            "fused_over_aten_add": statistics.median(times["aten_mm_add"]) / statistics.median(times["template_add_fused"]),
        }
    return {"shapes": results, "repeats": repeats, "options": options}


def _blocked_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int = 64) -> torch.Tensor:
    """Causal attention as plain matmuls over blocks of `rows` queries (each against the keys up to its
    end), grouped-query heads folded into the rows; inductor fuses the mask and softmax. [B, T, H, D]."""
    batch, seq_len, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    grouped = q.transpose(1, 2).reshape(batch, kv_heads, group, seq_len, head_dim)
    keys, values = k.transpose(1, 2), v.transpose(1, 2)
    outs = []
    for start in range(0, seq_len, rows):
        end = start + rows
        block = grouped[:, :, :, start:end].reshape(batch, kv_heads, group * rows, head_dim)
        scores = (block @ keys[:, :, :end].transpose(-1, -2)) * head_dim ** -0.5
        position = torch.arange(group * rows, device=q.device) % rows + start
        visible = position[:, None] >= torch.arange(end, device=q.device)[None, :]
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)
        outs.append((probs @ values[:, :, :end]).reshape(batch, kv_heads, group, rows, head_dim))
    return torch.cat(outs, 3).reshape(batch, heads, seq_len, head_dim).transpose(1, 2)


def _fused_qkv(attention, x: torch.Tensor):
    """Attention.project_qkv with one matmul against the concatenated q/k/v weights (cat inside forward)."""
    batch, seq_len, _ = x.shape
    weight = torch.cat([attention.wq.weight, attention.wk.weight, attention.wv.weight])
    q, k, v = F.linear(x, weight).split([attention.wq.out_features, attention.wk.out_features, attention.wv.out_features], -1)
    view = lambda t: t.view(batch, seq_len, -1, attention.head_dim)  # noqa: E731
    return attention.q_norm(view(q)), attention.k_norm(view(k)), view(v)


def _fused_gate_up(mlp, x: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, torch.cat([mlp.w1.weight, mlp.w3.weight])).chunk(2, -1)
    return mlp.w2(F.silu(gate) * up)


def block_kernel_profile(block, x: torch.Tensor, grad_out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict:
    """Self CPU ms per call of each kernel of one compiled block's forward+backward: inductor's fused C++
    kernels named one by one (cpp.enable_kernel_profile), the aten calls they make (mm, SDPA) by op."""
    from torch.profiler import ProfilerActivity, profile

    compiled = torch.compile(block, backend="inductor", options={"cpp.enable_kernel_profile": True})
    for _ in range(2):
        compiled(x, cos, sin).backward(grad_out)
    calls = 3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            compiled(x, cos, sin).backward(grad_out)
    x.grad = None
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    return {e.key: e.self_cpu_time_total / 1e3 / calls for e in events if e.self_cpu_time_total / 1e3 / calls >= 0.5}


def apply_levers(blocks) -> None:
    """The two block variants that were not slower (block_variants): blocked attention and fused gate/up."""
    import types

    for block in blocks:
        block.attention.sdpa.forward = _blocked_causal_attention
        block.mlp.forward = types.MethodType(_fused_gate_up, block.mlp)


BLOCK_VARIANTS = ("base", "fused_qkv", "fused_gate_up", "blocked_attention")


def block_variants(repeats: int) -> dict:
    """One native Qwen3 block at 8x512 (batch 4 x 512), compiled with inductor per variant, forward+backward,
    interleaved (order rotated): the unchanged block against fused projections (weights concatenated in
    forward, state dict unchanged) and causal attention as blocked matmuls in place of SDPA's flash kernel."""
    import copy
    import types

    from assay.models.layers import rotary_cos_sin
    from assay.models.qwen3.args import Qwen3Args
    from assay.models.qwen3.model import Block

    config = WRITTEN_SIZES["8x512"]
    args = Qwen3Args(vocab_size=1024, dim=config["hidden_size"], n_layers=1, n_heads=config["num_attention_heads"],
                     n_kv_heads=config["num_key_value_heads"], head_dim=config["head_dim"], hidden_dim=config["intermediate_size"])
    torch.manual_seed(0)
    reference = Block(args, 0)
    cos, sin = rotary_cos_sin(args.head_dim, SEQ_LEN, args.rope_theta)
    x = torch.randn(BATCH, SEQ_LEN, args.dim, requires_grad=True)
    grad_out = torch.randn(BATCH, SEQ_LEN, args.dim)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 4 * len(BLOCK_VARIANTS))
    compiled, first = {}, {}
    for name in BLOCK_VARIANTS:
        block = copy.deepcopy(reference)  # one module per variant: its own guards, its own graph
        if name == "fused_qkv":
            block.attention.project_qkv = types.MethodType(_fused_qkv, block.attention)
        elif name == "fused_gate_up":
            block.mlp.forward = types.MethodType(_fused_gate_up, block.mlp)
        elif name == "blocked_attention":
            block.attention.sdpa.forward = _blocked_causal_attention
        compiled[name] = torch.compile(block, backend="inductor")
        started = time.perf_counter()
        out = compiled[name](x, cos, sin)
        out.backward(grad_out)
        first[name] = {"compile_s": time.perf_counter() - started, "out": out.detach(), "grad": x.grad}
        x.grad = None
    times: dict[str, list[float]] = {name: [] for name in BLOCK_VARIANTS}
    for repeat in range(repeats):
        shift = repeat % len(BLOCK_VARIANTS)
        for name in BLOCK_VARIANTS[shift:] + BLOCK_VARIANTS[:shift]:
            started = time.perf_counter()
            compiled[name](x, cos, sin).backward(grad_out)
            times[name].append(time.perf_counter() - started)
            x.grad = None
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()  # noqa: E731
    return {
        "shape": {"batch": BATCH, "seq_len": SEQ_LEN, **config}, "repeats": repeats,
        "base_kernels_ms_per_call": block_kernel_profile(copy.deepcopy(reference), x, grad_out, cos, sin),
        "variants": {
            name: {
                "forward_backward_ms": spread([t * 1e3 for t in times[name]]), "compile_s": first[name]["compile_s"],
                "base_over_this": spread([b / t for b, t in zip(times["base"], times[name])]),
                "rel_diff_vs_base": {"output": rel(first[name]["out"], first["base"]["out"]),
                                     "input_grad": rel(first[name]["grad"], first["base"]["grad"])},
            }
            for name in BLOCK_VARIANTS
        },
    }


# ---------------------------------------------------------------- profile


# Where a step's CPU time goes, by kind of work: the matmuls and SDPA run the same aten kernels on every
# path, so their sum bounds how much faster than hf eager any path can get without faster kernels.
PROFILE_KINDS = (("matmul", ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")), ("sdpa", ("aten::_scaled_dot_product",)),
                 ("compiled_graphs", ("## Call CompiledFxGraph",)), ("optimizer", ("aten::_fused_adamw", "aten::_foreach")))


def profile_breakdown(averages) -> dict:
    """Self CPU seconds per kind of work (PROFILE_KINDS, the rest as `other`) of one profiled step."""
    kinds = {name: 0.0 for name, _ in PROFILE_KINDS} | {"other": 0.0}
    for event in averages:
        kind = next((name for name, prefixes in PROFILE_KINDS if event.key.startswith(prefixes)), "other")
        kinds[kind] += event.self_cpu_time_total / 1e6
    return kinds


def profile_paths(checkpoint: Path, peak: float, out: Path, paths=("hf", "native")) -> dict:
    from torch.profiler import ProfilerActivity, profile

    tables, totals, breakdown = [], {}, {}
    for path in paths:
        trainer = Trainer(request(checkpoint, path, 4, 1, peak))
        try:
            for step in range(3):  # compiled paths compile here, outside the profiled step
                trainer.step(step)
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                trainer.step(3)
        finally:
            trainer.close()
        averages = prof.key_averages()
        totals[path] = {e.key: e.self_cpu_time_total / 1e3 for e in sorted(averages, key=lambda e: -e.self_cpu_time_total)[:15]}
        breakdown[path] = profile_breakdown(averages)
        by_shape = prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=40, max_shapes_column_width=60)
        tables.append(f"===== {path}: one steady step at {checkpoint.name}\n{averages.table(sort_by='self_cpu_time_total', row_limit=25)}\n{by_shape}")
    out.write_text("\n".join(tables))
    return {"table": out.name, "top_self_cpu_ms": totals, "self_cpu_s_by_kind": breakdown}


# ---------------------------------------------------------------- report


def plot(report: dict, out: Path) -> None:
    fig, axes = new_figure(ncols=1, size=(8.0, 4.5))
    ax = axes[0][0]
    sizes = list(report["sizes"])
    shown = [path for path in PATHS + EXTRA_PATHS if any(path in report["sizes"][size]["paths"] for size in sizes)]
    width = 0.8 / len(shown)
    for index, path in enumerate(shown):
        values = [report["sizes"][size]["paths"].get(path, {}).get("steady_tokens_per_s") or 0.0 for size in sizes]
        ax.bar([i + (index - (len(shown) - 1) / 2) * width for i in range(len(sizes))], values, width, label=path)
    ax.set_xticks(range(len(sizes)), sizes)
    ax.set_yscale("log")
    ax.set_ylabel("steady tokens/s (log)")
    ax.set_title(f"training throughput, CPU fp32, batch {BATCH}x{SEQ_LEN} (load {report['load_average_before_after'][0][0]:.1f})")
    ax.legend(fontsize=8)
    save_figure(fig, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per path (warm-up included)")
    parser.add_argument("--timing-warmup", type=int, default=2)
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--compile-sizes", default="8x512", help="sizes that run native+compile (inductor takes minutes per size here)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, the same for every path")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--profile", action="store_true", help="per-op table of one steady step of hf and native")
    parser.add_argument("--profile-size", default="small", choices=tuple(WRITTEN_SIZES))
    parser.add_argument("--profile-paths", default="hf,native", help="paths to profile (native+compile compiles first)")
    parser.add_argument("--levers", action="store_true",
                        help="8x512 levers: inductor's C++ GEMM template vs aten per GEMM shape, one compiled block's variants")
    parser.add_argument("--out", type=Path, default=RESULTS / "train.json")
    options = parser.parse_args()
    sizes = [s for s in options.sizes.split(",") if s]
    paths = ["hf"] + [p for p in options.paths.split(",") if p and p != "hf"]
    torch.set_num_threads(options.threads)

    load_before = os.getloadavg()
    peak_before = measure_peak_flops("cpu", torch.float32)
    started = time.perf_counter()
    report: dict = {
        "benchmark": "train: hf vs native vs native+kernels vs native+compile, same trainer, steps interleaved per size",
        "config": {"batch": BATCH, "seq_len": SEQ_LEN, "dtype": "float32", "optimizer": "AdamW", "vocab_size": 1024,
                   "steps_per_path": options.steps, "timing_warmup_steps": options.timing_warmup, "written_sizes": WRITTEN_SIZES,
                   "kernels": KERNELS, "compile": "per block, inductor"},
        "device": "cpu", "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__, "sizes": {},
    }
    with tempfile.TemporaryDirectory() as scratch:
        folders = checkpoints(Path(scratch), sizes)
        for size in sizes:
            size_paths = [p for p in paths if not p.startswith("native+compile") or size in options.compile_sizes.split(",")]
            print(f"[train_bench] {size}: {', '.join(size_paths)}", file=sys.stderr, flush=True)
            report["sizes"][size] = run_size(size, folders[size], size_paths, options.steps, options.timing_warmup, peak_before)
            # Saved as it goes (marked partial): a run cut short on a loaded machine keeps its finished sizes.
            atomic_write_json(options.out, report | {"partial": True, "load_average_before_after": [load_before, os.getloadavg()]})
        peak_after = measure_peak_flops("cpu", torch.float32)
        peak = max(peak_before, peak_after)
        if not options.no_memory:
            print("[train_bench] memory: chunked loss, activation checkpointing", file=sys.stderr, flush=True)
            report["chunked_loss_memory"] = chunked_loss_memory(Path(scratch), options.threads)
            ac_folder = folders.get("small") or checkpoints(Path(scratch), ["small"])["small"]
            report["activation_checkpointing"] = activation_checkpointing(ac_folder, 6, 2, peak, options.threads)
        report["grouped_experts_vs_loop"] = grouped_experts_vs_loop(20)
        if options.levers:
            print("[train_bench] levers: GEMM template, block variants", file=sys.stderr, flush=True)
            report["gemm_template_vs_aten"] = gemm_template_vs_aten(10)
            report["block_variants"] = block_variants(8)
        atomic_write_json(options.out, report | {"partial": True})
        if options.profile:
            size = options.profile_size
            folder = folders.get(size) or checkpoints(Path(scratch), [size])[size]
            report["profile"] = profile_paths(folder, peak, options.out.with_name(options.out.stem + "_profile.txt"),
                                              [p for p in options.profile_paths.split(",") if p])
    # MFU against the higher of the two peak measurements (the trainers used the first; rescale).
    for size in report["sizes"].values():
        for entry in size["paths"].values():
            if entry["steady_mfu"] is not None:
                entry["steady_mfu"] *= peak_before / peak
    report |= {
        "peak_flops_fp32_measured": peak, "peak_flops_fp32_before_after": [peak_before, peak_after],
        "wall_s": time.perf_counter() - started, "load_average_before_after": [load_before, os.getloadavg()],
        "note": "2-core CPU shared with other engineers' processes during the run (see load averages): absolute "
                "tokens/s, MFU and the measured peak move with their load; ratios come from interleaved steps.",
    }
    report["targets"] = targets(report)
    atomic_write_json(options.out, report)
    if report["sizes"]:  # a profile-only run has no tokens/s to draw
        plot(report, options.out.with_suffix(".png"))
    rows = [
        {"size": size, "path": path, "tokens_per_s": entry["steady_tokens_per_s"], "mfu": entry["steady_mfu"],
         "over_hf": "" if path == "hf" else f"{entry['over_hf']['median']:.2f} ({entry['over_hf']['min']:.2f}-{entry['over_hf']['max']:.2f})",
         "warmup_s": entry["warmup_s"]}
        for size, result in report["sizes"].items() for path, entry in result["paths"].items()
    ]
    print_table(rows, ["size", "path", "tokens_per_s", "mfu", "over_hf", "warmup_s"],
                title=f"training, median step ratio to hf (min-max); peak {peak / 1e9:.0f} GFLOP/s measured; {options.out}")
    print(json.dumps(report["targets"], indent=1))


def targets(report: dict) -> dict:
    met = {}
    for size, result in report["sizes"].items():
        native = result["paths"].get("native")
        if native:
            met[f"native>=1.0x hf @{size}"] = native["over_hf"]["median"] >= TARGETS["native"]
    for size, result in report["sizes"].items():
        compiled = result["paths"].get("native+compile")
        if compiled:  # the targets are at 8x512; reported at whichever size ran compiled
            met[f"native+compile>=1.2x hf @{size}"] = compiled["over_hf"]["median"] >= TARGETS["native+compile@8x512"]
            met[f"native+compile MFU>=0.6 of peak @{size}"] = (compiled["steady_mfu"] or 0.0) >= TARGETS["compile_mfu_fraction_of_peak"]
            met[f"native+compile graph breaks == 0 @{size}"] = compiled["compile"]["graph_breaks"] == 0
    return met


if __name__ == "__main__":
    main()
