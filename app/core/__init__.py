"""Pure domain logic: no Qt, no I/O."""
