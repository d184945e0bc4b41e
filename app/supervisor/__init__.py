"""asyncio only, no Qt: the router (the one owner of what runs: loading policy, one-click loads,
recovery, downloads, engine usage samples), and below it backend installs (fetch, verify, unpack, the
mlx-lm venv), engine processes (state machine, readiness, watchdog, clean stop, lemon-mlx's speed
lines), model downloads and the Hub, model metadata, the machine's support matrix, and the supervisor
that owns installs and engines and reports events. No local API yet.
"""
