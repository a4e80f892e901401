"""Fixed-state model benchmarks: gla_chunk over length and gate strength, its A/B at a revision, the GLA model, recall against attention."""
