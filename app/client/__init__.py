"""OpenAI-compatible streaming client (httpx), SSE parsing, telemetry extraction."""
