"""Native models, torchtitan-style: one folder per architecture (args, model, state-dict adapter,
parallelize), and hf_checkpoint for reading and writing Hugging Face checkpoint folders."""
