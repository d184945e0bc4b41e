"""PySide6 widgets only: they never await and never do I/O."""
