"""Training benchmarks: throughput and MFU per path, memory, compile levers, distributed Muon, the kernels against their references."""
