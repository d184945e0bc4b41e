"""The router package's face: what front ends may import from ``app.supervisor.router``. A name added
to or dropped from the face is a decision, made here on purpose (as httpx pins its exported members)."""

from __future__ import annotations

import types

import app.supervisor.router as face

FACE = {
    "Catalog",
    "Dialect",
    "EngineRecovery",
    "EngineSnapshot",
    "EngineUsage",
    "Listener",
    "LoadProgress",
    "ModelView",
    "ModelsChanged",
    "RequestFinished",
    "RequestSource",
    "Router",
    "RouterEvent",
    "Suggestion",
    "device_of",
}


def test_the_face_exports_exactly_the_pinned_names() -> None:
    assert set(face.__all__) == FACE
    assert len(face.__all__) == len(FACE), "each name once"


def test_every_public_name_of_the_face_is_exported_and_nothing_else_leaks() -> None:
    public = {
        name
        for name, value in vars(face).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == FACE


def test_each_exported_class_and_function_is_defined_in_one_of_the_routers_parts() -> None:
    defined = [v for v in map(face.__dict__.get, FACE) if isinstance(v, type | types.FunctionType)]
    assert len(defined) == len(FACE) - 2, "all but the two type aliases, Listener and RouterEvent"
    for value in defined:
        assert value.__module__.startswith("app.supervisor.router."), f"{value} comes from {value.__module__}"
