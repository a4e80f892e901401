"""Native models, torchtitan-style: one folder per architecture (args, model, state-dict adapter,
parallelize), and hf_checkpoint for reading and writing Hugging Face checkpoint folders."""

# Where the architecture registry's built-in entries live (assay.models.registry imports each on its first
# lookup). Here, not in the registry, so that a command's --help can name them without importing torch.
ARCH_PACKAGES: tuple[str, ...] = ("assay.models.qwen3", "assay.models.gla", "assay.models.llama", "assay.models.gemma3")


def builtin_arch_names() -> list[str]:
    """The registry's built-in architecture names (each package's last part), torch-free."""
    return [package.rsplit(".", 1)[-1] for package in ARCH_PACKAGES]
