"""asyncio only, no Qt: the router package (``router/``: the one owner of what runs, one face over its
parts: loading policy, one-click loads, recovery, pulls, requests, usage samples, the RPC worker), the
local API over it (``api/``), and below them backend installs (fetch, verify, unpack, the mlx-lm venv),
engine processes (state machine, readiness, watchdog, clean stop, lemon-mlx's speed lines), model
downloads and the Hub, model metadata, remotes, the machine's support matrix, and the supervisor that
owns installs and engines and reports events. Above the router sit its clients: ``bench``.
"""
