"""Make Transformers' Auto classes know assay's own architectures (today: GLA, model_type "gla"), the
way flash-linear-attention registers its models: AutoConfig.register and AutoModelForCausalLM.register.

`import assay` calls install(), which must stay light (`assay --help` never imports torch): when
Transformers is not imported yet, install() adds an import hook that registers right after
Transformers' auto modules load: the config when configuration_auto loads, the model when modeling_auto
loads (a stand-in that imports the model class at its first from_pretrained / from_config: deferred_model).
A process that imports assay first and Transformers later, a zygote's forked probes, and a run.py that does
`import assay` all find GLA.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys

# model_type -> (config class, model class) as "module:attribute"; the module a run.py must import.
AUTO_MODELS: dict[str, tuple[str, str]] = {
    "gla": ("assay.models.gla.hf_config:GLAConfig", "assay.models.gla.hf_model:GLAForCausalLM"),
}
MODEL_CODE = "assay"  # what a script imports to get these registrations

_CONFIG_MODULE = "transformers.models.auto.configuration_auto"
_MODEL_MODULE = "transformers.models.auto.modeling_auto"


def _attribute(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def register_configs() -> None:
    from transformers import AutoConfig

    for model_type, (config_path, _) in AUTO_MODELS.items():
        AutoConfig.register(model_type, _attribute(config_path), exist_ok=True)


def register_models() -> None:
    from transformers import AutoModelForCausalLM

    register_configs()
    for config_path, model_path in AUTO_MODELS.values():
        model = _attribute(model_path) if _loaded(model_path) else deferred_model(config_path, model_path)
        AutoModelForCausalLM.register(_attribute(config_path), model, exist_ok=True)


def _loaded(path: str) -> bool:
    """The class is importable without importing anything (its module is loaded and past the class)."""
    module, _, name = path.partition(":")
    return getattr(sys.modules.get(module), name, None) is not None


def deferred_model(config_path: str, model_path: str) -> type:
    """What the Auto class holds for a model class not imported yet: a class of the same name whose
    from_pretrained and _from_config (what AutoModelForCausalLM.from_pretrained / from_config call) import the
    real one, register it in its place and hand over. Transformers imports its Auto model module whenever a
    tokenizer loads; importing a PreTrainedModel there would put its modeling code (about 2 CPU-seconds) on
    every process that only tokenizes or runs assay's native models."""
    config_class = _attribute(config_path)

    def real() -> type:
        from transformers import AutoModelForCausalLM

        model_class = _attribute(model_path)
        AutoModelForCausalLM.register(config_class, model_class, exist_ok=True)
        return model_class

    def from_pretrained(cls, *args, **kwargs):
        return real().from_pretrained(*args, **kwargs)

    def _from_config(cls, config, **kwargs):
        return real()._from_config(config, **kwargs)

    module, _, name = model_path.partition(":")
    return type(name, (), {"__module__": module, "__doc__": f"{name}, imported at its first use.", "config_class": config_class,
                           "from_pretrained": classmethod(from_pretrained), "_from_config": classmethod(_from_config)})


def model_code_for(model_type: str | None) -> str | None:
    """The module a script must import before from_pretrained for this model_type, None when Transformers knows it."""
    return MODEL_CODE if model_type in AUTO_MODELS else None


class _Loader(importlib.abc.Loader):
    """The real loader, then a registration once the module is complete."""

    def __init__(self, loader, after):
        self._loader, self._after = loader, after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._after()


class _AfterImport(importlib.abc.MetaPathFinder):
    HOOKS = {_CONFIG_MODULE: register_configs, _MODEL_MODULE: register_models}

    def find_spec(self, name, path, target=None):
        if name not in self.HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self.HOOKS[name])
                return spec
        return None


_installed = False


def install() -> None:
    """Register now for the auto modules already imported; hook the ones not imported yet."""
    global _installed
    if _installed:
        return
    _installed = True
    if _MODEL_MODULE in sys.modules:
        register_models()
    elif _CONFIG_MODULE in sys.modules:
        register_configs()
    if _MODEL_MODULE not in sys.modules:
        sys.meta_path.insert(0, _AfterImport())
