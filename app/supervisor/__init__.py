"""asyncio only, no Qt: backend installs (fetch, verify, unpack, the mlx-lm venv), engine processes
(state machine, readiness, watchdog, clean stop, lemon-mlx's speed lines), model downloads and the
Hub, model metadata, the machine's support matrix, and the supervisor that owns installs and engines
and reports events. No loading policy yet (one engine per model, replaced on reload) and no local API.
"""
