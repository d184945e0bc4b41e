"""Real services for tests: loopback HTTP servers, a keychain, engines and models (cached)."""
