"""The probe on several devices: the processes it starts itself, one model sharded across them.

Every rank loads its shard (tensor parallel through the model's tp_plan, or expert parallel), runs
the same compiled generation as a one-device probe, and the ranks agree after each phase whether to
go on (so one rank's failure ends all of them instead of leaving the others in a collective).
Rank 0 reports (its tokens, its raw logits for the drift columns, and with --eval its task scores);
the checks (judge, single-device reference, the eval's reference) run in the probe's own process.

--eval on every rank: the model is tensor- (or expert-) parallel, so each forward is a collective; every
rank runs the same lm-eval requests in the same order at the same padded shapes (lm-eval sees one
process: the model object is passed in, so it splits no data), and rank 0 records.
"""

from __future__ import annotations

import time
import traceback

import torch

from assay.compat.probe import recipe


def _all_ok(ok: bool) -> bool:
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def probe_rank(load_path: str, task: str, device_type: str, dtype: str, parallelism: str, num_devices: int, backend: str, new_tokens: int,
               eval_paths: list[str] = (), eval_limit: int | None = None) -> dict:
    """Runs on every rank; rank 0's dict is the report."""
    import torch.distributed as dist

    from assay.compat.probe.request import classify_exception, one_line
    from assay.core.compiling import CompileStats, counting_backend, watch
    from assay.core.device import PeakMemory

    rank = dist.get_rank()
    device = device_type if device_type == "cpu" else f"{device_type}:{rank}"
    report: dict = {"failure": None}
    stats = CompileStats()

    def fail(phase: str, exc: BaseException) -> None:
        report["failure"] = (classify_exception(exc, phase), f"rank {rank}: {one_line(exc)}", traceback.format_exc())

    with PeakMemory(device) as meter:
        try:
            start = time.perf_counter()
            model = recipe.load_model(load_path, task, device, dtype, parallelism, num_devices)
            inputs = recipe.make_inputs(load_path, task, device)
            report["load_s"] = time.perf_counter() - start
            report["prompt_tokens"] = int(inputs["input_ids"].shape[1])
        except Exception as exc:
            fail("load", exc)
        if _all_ok(report["failure"] is None):
            config = recipe.compile_config(counting_backend(backend, stats))
            try:
                with watch(stats):
                    start = time.perf_counter()
                    report["tokens"], _, logits = recipe.generate_logits(model, inputs, new_tokens, config, output_scores=False)
                    report["logits"] = _local(logits)
                    report["compile_s"] = time.perf_counter() - start
                    start = time.perf_counter()
                    recipe.generate(model, inputs, new_tokens, config)
                    report["decode_tokens_per_s"] = new_tokens / (time.perf_counter() - start)
            except Exception as exc:
                fail("compile" if "compile_s" not in report else "run", exc)
            if _all_ok(report["failure"] is None) and eval_paths:
                report["eval"] = _score_tasks(model, load_path, backend, eval_paths, eval_limit)
    report["peak_memory_bytes"] = meter.peak_bytes
    report["memory_kind"] = meter.kind
    report["stats"] = stats.as_dict()
    # The first failing rank's report wins: gather everyone's to rank 0.
    reports = [None] * dist.get_world_size()
    dist.all_gather_object(reports, report)
    failed = [r for r in reports if r["failure"]]
    return failed[0] if failed else report


def _local(tensor):
    """A plain tensor on the CPU (a DTensor's full value): what the report carries to the probe's process."""
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return full.detach().to("cpu", torch.float32)


def _score_tasks(model, load_path: str, backend: str, eval_paths: list[str], eval_limit: int | None) -> dict:
    from assay.compat.probe.evaluation import score_compiled

    return score_compiled(model, load_path, backend, eval_paths, eval_limit)
