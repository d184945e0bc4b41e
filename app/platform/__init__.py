"""Hardware probing behind one function: ``detect_hardware()``."""

from app.platform.probe import detect_hardware, find_system_llama_server

__all__ = ["detect_hardware", "find_system_llama_server"]
