"""asyncio only: installer, engine processes, health, loading policy, telemetry, local API."""
