"""Bundled data: the model catalog, backend pins, icons (read through importlib.resources)."""
