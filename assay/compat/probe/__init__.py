"""The probe of one checkpoint: its request and plan, the load-compile-generate recipe, the CPU eager reference, the eval phase, the sharded run."""
