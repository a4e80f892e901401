"""Serving benchmarks: the engine, the HTTP service, speed and TTFT on the real model, lm-eval through the server, the soak."""
