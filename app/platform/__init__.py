"""Hardware probing behind one function, ``detect_hardware()``; the memory free now; who holds a port."""

from app.platform.memory import free_memory
from app.platform.ports import listener_of
from app.platform.probe import detect_hardware, find_system_llama_server

__all__ = ["detect_hardware", "find_system_llama_server", "free_memory", "listener_of"]
