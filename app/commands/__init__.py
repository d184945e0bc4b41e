"""Handlers of ``lemon-desk``'s headless subcommands, one module each; ``app.cli`` registers them."""
