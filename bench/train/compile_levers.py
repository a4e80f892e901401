"""Issue 17's third pass at --compile, at 8x512 (docs/training.md, "Third pass"): inductor's C++ GEMM
template against aten per GEMM shape, and one compiled block's variants (fused q/k/v, fused gate/up,
causal attention as blocked matmuls) with the block's per-kernel profile. `apply_levers` patches the two
variants that were not slower into a trainer's blocks (the `native+compile-levers` path of bench/train/throughput.py).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from bench.train.fixtures import BATCH, SEQ_LEN, WRITTEN_SIZES, spread


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

    from assay.models.common.rope import rotary_cos_sin
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

