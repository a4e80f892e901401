"""Running probes: one in its own process (isolate, worker, zygote), many in a sweep (placement, local or Ray), and triage's reruns."""
