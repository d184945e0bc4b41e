"""Hardware probing behind one function, ``detect_hardware()``; and the memory free now."""

from app.platform.memory import free_memory
from app.platform.probe import detect_hardware, find_system_llama_server

__all__ = ["detect_hardware", "find_system_llama_server", "free_memory"]
