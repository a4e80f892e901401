"""Results and catalogs the app's tests share, and helpers to serve the app in a subprocess."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

from compat.test_dataset import make_row

from assay.app.catalog import recorded_list_models, refresh_catalog, zoo_catalog

DATA = Path(__file__).parent / "data"
RECORDED = DATA / "list_models_text_generation.json"

OLD = "cpu-inductor-torch2.13.0-tf5.24.0-aaaa1111"
NEW = "cpu-inductor-torch2.14.0-tf5.25.0-bbbb2222"
GPU = "cuda-inductor-torch2.14.0-tf5.25.0-cccc3333"

XSS_MODEL = 'evil/<img src=y onerror="window.__xss=3"><b>bold</b>'
XSS_ERROR = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
XSS_RUN_PY = "# </textarea><script>window.__xss=4</script>\nprint('<b>hi</b>')\n"
# A minified repro as `assay triage` stores it (schema 4), and dynamo's reasons for the failure.
REPRO_PY = "import torch\nclass Repro(torch.nn.Module):\n    def forward(self, add):\n        rsqrt = torch.rsqrt(add)\n        return (rsqrt,)\n"
SETATTR_BREAK = "break: Unsupported: setattr on a module attribute"
TRIAGED = dict(repro_py=REPRO_PY, repro_lines=5, repro_verified=True, repro_after="dynamo", triage_s=42.0,
               triage_reason="minified; 5 lines; alone it reproduces the failure")


def versions(torch: str, transformers: str, triton: str = "3.9.0") -> str:
    return json.dumps({"compiler": {"torch": torch, "triton": triton}, "libraries": {"torch": torch, "transformers": transformers},
                       "python": "3.11.7", "backend": "inductor"})


def traceback_text(message: str, path: str = "/home/ci/site-packages/torch/_dynamo/eval_frame.py", line: int = 632) -> str:
    return (f"Traceback (most recent call last):\n  File \"{path}\", line {line}, in _fn\n    return fn(*args, **kwargs)\n"
            f"{message}\n")


def zoo(name: str, public: str, stack: str, status: str = "PASS", **extra) -> dict:
    old = stack == OLD
    fields = dict(
        stands_in_for=public, task="text-generation", versions=versions("2.13.0" if old else "2.14.0", "5.24.0" if old else "5.25.0"),
        load_s=0.5, compile_s=4.0, decode_tokens_per_s=120.0, total_s=6.0, peak_memory_bytes=400 * 2**20, num_devices=1,
        device_name="cpu", run_py=f"# run.py for {name}\nimport torch\nprint('probe {name}')\n",
        command=f"assay probe zoo/{name} --device cpu --backend inductor --dtype float32 --new-tokens 32 --out results/",
    )
    return make_row(f"assay-zoo/{name}", stack=stack, status=status, backend="inductor", **(fields | extra))


def mixed_rows() -> list[dict]:
    """Two CPU stacks and a GPU one: a regression, a fix, a skip, shared failure signatures, an XSS plant."""
    shape_error = "RuntimeError: shape '[1, {n}]' is invalid for input of size {m} at 0x7f{h}"
    return [
        zoo("qwen3", "Qwen/Qwen3-0.6B", OLD, compile_s=5.5, peak_memory_bytes=512 * 2**20, **drift([0.0, 2e-7, 4e-7]),
            **evaluated([0.71, 0.59], [0.71, 0.59], [1.0, 1.0])),
        zoo("llama", "meta-llama/Llama-3.2-1B", OLD, compile_s=3.0),
        zoo("gpt2", "openai-community/gpt2", OLD, "SKIPPED", reason="low priority: deliberately not run"),
        zoo("mistral", "mistralai/Mistral-7B-v0.1", OLD, "FAIL_COMPILE", reason="Unsupported: call_function",
            error=traceback_text("torch._dynamo.exc.Unsupported: call_function 'setattr' in /tmp/a/modeling_mistral.py line 12"),
            compile_reasons=[SETATTR_BREAK]),
        make_row("org/plain-model", stack=OLD, task="text-generation", versions=versions("2.13.0", "5.24.0"), compile_s=2.0),
        zoo("qwen3", "Qwen/Qwen3-0.6B", NEW, "FAIL_RUN", reason="shape invalid", error=traceback_text(shape_error.format(n=32, m=48, h="aa10"))),
        zoo("llama", "meta-llama/Llama-3.2-1B", NEW, "FAIL_RUN", reason="shape invalid",
            error=traceback_text(shape_error.format(n=64, m=96, h="bb20"), path="/opt/other/torch/x.py", line=7)),
        zoo("gpt2", "openai-community/gpt2", NEW),
        zoo("mistral", "mistralai/Mistral-7B-v0.1", NEW, "FAIL_COMPILE", reason="Unsupported: call_function",
            error=traceback_text("torch._dynamo.exc.Unsupported: call_function 'getattr' in /tmp/b/modeling_mistral.py line 99"),
            compile_reasons=[SETATTR_BREAK, "recompile: tensor 'x' size mismatch at index 1. expected 8, actual 9"], **TRIAGED),
        make_row(XSS_MODEL, stack=NEW, status="FAIL_LOAD", task="text-generation", versions=versions("2.14.0", "5.25.0"),
                 reason='<img src=z onerror="window.__xss=5">', error=XSS_ERROR, run_py=XSS_RUN_PY, command="assay probe '<b>x</b>'"),
        zoo("qwen3", "Qwen/Qwen3-0.6B", GPU, device="cuda:0", device_name="NVIDIA H200", num_devices=2, parallelism="tensor",
            versions=versions("2.14.0", "5.25.0", triton="3.10.0"), **drift([1e-3, 2e-2, 5e-2]),
            **evaluated([0.70, 0.52], [0.71, 0.59], [0.97, 0.90])),
    ]


def drift(max_rel: list[float]) -> dict:
    """Schema 4's logit drift columns for a row, from its per-step relative drift."""
    return dict(logit_max_rel=max_rel, logit_max_abs=[10 * v for v in max_rel], logit_cosine=[1 - v for v in max_rel],
                logit_max_rel_max=max(max_rel), logit_max_abs_max=10 * max(max_rel), logit_cosine_min=1 - max(max_rel),
                logit_reference_dtype="float32")


def evaluated(accuracy: list[float], reference: list[float], agreement: list[float]) -> dict:
    """Schema 5's eval columns for a row of the two embedded tasks (100 items each; the first items changed
    answer), with the verdict eval_compare gives them."""
    from assay.compat.eval.compare import TaskComparison, row_columns

    comparisons = [TaskComparison(task, 100, a, r, g, 0.5 * (1 - g) + 1e-4, list(range(round(100 * (1 - g)))), 12.0, 30.0)
                   for task, a, r, g in zip(("assay_cloze", "assay_next_sentence"), accuracy, reference, agreement)]
    return row_columns(comparisons) | {"eval_graphs": 2, "eval_recompiles": 1, "eval_reference_cache_hit": True,
                                       "eval_reference_dtype": "float32", "eval_s": 84.0}


def recorded_catalog():
    return refresh_catalog("text-generation", 5, list_models=recorded_list_models(RECORDED), existing=zoo_catalog())


def wait_until_served(url: str, process: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the app exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the app did not answer at {url} within {timeout} s:\n{log.read_text()}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
