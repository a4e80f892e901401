"""Muon for hidden weight matrices and AdamW for everything else, in one optimizer object.

Muon (Keller Jordan, 2024) replaces each 2-D hidden matrix's momentum update by its nearest
semi-orthogonal matrix (Newton-Schulz iterations). Embeddings, the output head, norms and biases are
not hidden matrices and take AdamW (the Muon authors' and torch.optim.Muon's recommendation).

The Muon part follows torch.optim.Muon (torch 2.13) exactly: the same defaults, coefficients, the
same operations in the same order, so on one device its updates equal torch.optim.Muon's bit for bit.
The AdamW part follows torch.optim.AdamW's single-tensor path (what it runs on CPU).

On FSDP2 parameters (DTensor, Shard(0) on a 1-D mesh) the Newton-Schulz step runs on whole matrices
handed between ranks by two all-to-all exchanges (distributed_muon.py); `comm_stats` counts the
bytes moved next to what all-gathering every matrix would have moved.

    opt = Muon.for_model(model, lr=0.02, adamw_lr=3e-4)     # groups tagged use_muon True/False
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

from assay.core.errors import AssayError
from assay.optim.distributed_muon import EXCHANGES, CommStats, NewtonSchulz, orthogonalize_sharded

try:  # builds without torch.distributed have no DTensor; every parameter is then a plain tensor
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # pragma: no cover - depends on the torch build
    DTensor, Shard = (), None

# torch.optim.Muon's constants (from Keller Jordan's Muon post).
DEFAULT_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
DEFAULT_EPS = 1e-7
DEFAULT_NS_STEPS = 5

# Parameters whose owning module is one of these, or whose name holds "embed", are not hidden matrices.
HEAD_MODULE_NAMES = ("lm_head", "output", "head")


def zeropower_via_newtonschulz(update: torch.Tensor, settings: NewtonSchulz) -> torch.Tensor:
    """torch.optim.Muon's quintic Newton-Schulz iteration, in bfloat16; returns a new bfloat16 matrix.

    One difference: the input is always copied, so a bfloat16 momentum buffer is never scaled in place
    (torch.optim.Muon's `grad.bfloat16()` aliases a bfloat16 input, then divides it in place).
    """
    if settings.steps >= 100:
        raise AssayError("Muon: ns_steps must be below 100")
    if update.dim() != 2:
        raise AssayError(f"Muon: Newton-Schulz needs a 2-D matrix; got {tuple(update.shape)}")
    a, b, c = settings.coefficients
    ortho = update.to(torch.bfloat16, copy=True)
    tall = update.size(0) > update.size(1)
    if tall:
        ortho = ortho.T
    ortho.div_(ortho.norm().clamp(min=settings.eps))  # spectral norm <= Frobenius norm <= 1
    for _ in range(settings.steps):
        gram = ortho @ ortho.T
        gram_update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        ortho = torch.addmm(ortho, gram_update, ortho, beta=a)
    return ortho.T if tall else ortho


def adjust_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's learning-rate scaling: "original" sqrt(max(1, A/B)), "match_rms_adamw" 0.2 sqrt(max(A, B))."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        ratio = math.sqrt(max(1, rows / cols))
    elif adjust_lr_fn == "match_rms_adamw":
        ratio = 0.2 * math.sqrt(max(rows, cols))
    else:
        ratio = 1.0
    return lr * ratio


def is_hidden_matrix(name: str, param: torch.Tensor, module: nn.Module) -> bool:
    """The Muon rule: a 2-D weight that is neither an embedding nor the output head."""
    if param.ndim != 2 or isinstance(module, nn.Embedding) or "embed" in name.lower():
        return False
    module_name = name.rsplit(".", 1)[0] if "." in name else ""
    return module_name.rsplit(".", 1)[-1] not in HEAD_MODULE_NAMES


def split_params(model: nn.Module) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """(muon, adamw) named parameters of a model by `is_hidden_matrix`; frozen parameters are left out.

    Tied weights appear once (named_parameters drops duplicates), under their first name.
    """
    muon, adamw = [], []
    modules = dict(model.named_modules())
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        module = modules.get(name.rsplit(".", 1)[0] if "." in name else "", model)
        (muon if is_hidden_matrix(name, param, module) else adamw).append((name, param))
    return muon, adamw


def muon_param_groups(model: nn.Module) -> list[dict]:
    """Two parameter groups for Muon: hidden matrices (use_muon=True) and the rest (use_muon=False)."""
    muon, adamw = split_params(model)
    groups = []
    if muon:
        groups.append({"params": [param for _, param in muon], "use_muon": True})
    if adamw:
        groups.append({"params": [param for _, param in adamw], "use_muon": False})
    return groups


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local shard (same storage), a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class Muon(torch.optim.Optimizer):
    """Muon on groups tagged use_muon=True (the default for an untagged group), AdamW on use_muon=False.

    Muon arguments and defaults are torch.optim.Muon's; adamw_* are the AdamW groups' defaults
    (torch.optim.AdamW's). A group may override any of its kind's keys (lr, weight_decay, betas, eps, ...).
    exchange: "all_to_all" (whole matrices to owner ranks, two exchanges) or "all_gather" (every rank
    gathers and orthogonalises every matrix: the naive way, kept for measurement).
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = DEFAULT_NS_COEFFICIENTS,
        eps: float = DEFAULT_EPS,
        ns_steps: int = DEFAULT_NS_STEPS,
        adjust_lr_fn: str | None = None,
        adamw_lr: float = 1e-3,
        adamw_betas: tuple[float, float] = (0.9, 0.999),
        adamw_eps: float = 1e-8,
        adamw_weight_decay: float = 1e-2,
        exchange: str = "all_to_all",
    ) -> None:
        for label, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay), ("adamw_lr", adamw_lr), ("adamw_weight_decay", adamw_weight_decay)):
            if not value >= 0.0:
                raise AssayError(f"Muon: {label} must be >= 0; got {value}")
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise AssayError(f"Muon: adjust_lr_fn must be None, 'original' or 'match_rms_adamw'; got {adjust_lr_fn!r}")
        if exchange not in EXCHANGES:
            raise AssayError(f"Muon: exchange must be one of {', '.join(EXCHANGES)}; got {exchange!r}")
        self.exchange = exchange
        self.comm_stats = CommStats(exchange=exchange)
        self._adamw_defaults = {"lr": adamw_lr, "betas": adamw_betas, "eps": adamw_eps, "weight_decay": adamw_weight_decay}
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": tuple(ns_coefficients),
            "eps": eps,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
        }
        params = list(params)
        if params and not isinstance(params[0], dict):
            params = [{"params": params}]
        super().__init__(params, defaults)

    @classmethod
    def for_model(cls, model: nn.Module, **kwargs) -> "Muon":
        """Muon on the model's hidden matrices, AdamW on the rest (see `split_params`)."""
        return cls(muon_param_groups(model), **kwargs)

    def add_param_group(self, param_group: dict) -> None:
        group = dict(param_group)
        group.setdefault("use_muon", True)
        if not group["use_muon"]:
            for key, value in self._adamw_defaults.items():
                group.setdefault(key, value)
        super().add_param_group(group)
        if group["use_muon"]:
            for param in self.param_groups[-1]["params"]:
                if param.ndim != 2:
                    raise AssayError(
                        f"Muon takes 2-D hidden matrices only; got a parameter of shape {tuple(param.shape)} "
                        f"(put it in a group with use_muon=False, or build groups with muon_param_groups(model))"
                    )

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        muon_work: list[tuple[torch.Tensor, dict]] = []
        for group in self.param_groups:
            if group["use_muon"]:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if torch.is_complex(param) or param.grad.is_sparse:
                        raise AssayError("Muon supports neither complex parameters nor sparse gradients")
                    state = self.state[param]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(param.grad, memory_format=torch.preserve_format)
                    muon_work.append((param, group))
            else:
                self._adamw_group(group)
        self._muon(muon_work)
        return loss

    def _muon(self, work: list[tuple[torch.Tensor, dict]]) -> None:
        updates = []
        for param, group in work:
            grad = _local(param.grad)
            buffer = _local(self.state[param]["momentum_buffer"])
            buffer.lerp_(grad, 1 - group["momentum"])
            updates.append(grad.lerp(buffer, group["momentum"]) if group["nesterov"] else buffer)
        orthogonal = self._orthogonalize(work, updates)
        for (param, group), ortho in zip(work, orthogonal):
            lr = group["lr"]
            local = _local(param)
            local.mul_(1 - lr * group["weight_decay"])
            local.add_(ortho, alpha=-adjust_lr(lr, group["adjust_lr_fn"], param.shape))

    def _orthogonalize(self, work, updates) -> list[torch.Tensor]:
        """Newton-Schulz of every whole update, as this rank's rows: locally, or via the exchanges for FSDP2 shards."""
        result: list[torch.Tensor | None] = [None] * len(work)
        sharded: dict[int, list[int]] = {}  # mesh id -> indices of work items sharded on it
        meshes = {}
        for index, (param, group) in enumerate(work):
            if isinstance(param, DTensor) and any(p.is_shard() for p in param.placements):
                if param.device_mesh.ndim != 1 or param.placements[0] != Shard(0):
                    raise AssayError(
                        f"Muon: a parameter sharded as {param.placements} on a {param.device_mesh.ndim}-D mesh; "
                        "supported: FSDP2's Shard(0) on a 1-D mesh, or unsharded parameters"
                    )
                sharded.setdefault(id(param.device_mesh), []).append(index)
                meshes[id(param.device_mesh)] = param.device_mesh
            else:
                result[index] = zeropower_via_newtonschulz(updates[index], _settings(group))
        for mesh_id, indices in sharded.items():
            local_rows = orthogonalize_sharded(
                updates=[updates[i] for i in indices],
                shapes=[tuple(work[i][0].shape) for i in indices],
                settings=[_settings(work[i][1]) for i in indices],
                orthogonalize=zeropower_via_newtonschulz,
                group=meshes[mesh_id].get_group(),
                exchange=self.exchange,
                stats=self.comm_stats,
            )
            for i, rows in zip(indices, local_rows):
                result[i] = rows
        return result

    def _adamw_group(self, group: dict) -> None:
        """torch.optim.AdamW's single-tensor step (decoupled weight decay, no amsgrad), on local shards."""
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        for param in group["params"]:
            if param.grad is None:
                continue
            if param.grad.is_sparse:
                raise AssayError("Muon's AdamW groups do not support sparse gradients")
            state = self.state[param]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            local, grad = _local(param), _local(param.grad)
            exp_avg, exp_avg_sq = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
            state["step"] += 1
            step = state["step"].item()
            local.mul_(1 - lr * weight_decay)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            bias_correction1 = 1 - beta1**step
            bias_correction2_sqrt = (1 - beta2**step) ** 0.5
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            local.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)


def _settings(group: dict) -> NewtonSchulz:
    return NewtonSchulz(coefficients=tuple(group["ns_coefficients"]), steps=group["ns_steps"], eps=group["eps"])
