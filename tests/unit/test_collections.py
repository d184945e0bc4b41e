"""Collections: save, export (Lemonade's collection file), wipe, import, load under the policy with the
stand-in engine; hostile files refused with the field that is wrong; an unreadable store set aside."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli import main
from app.core.errors import ConfigError
from app.store.collections import collection_from_json, collections_path
from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from app.supervisor.router import Router
from tests.support.serve import serving
from tests.support.standin import make_standin_model


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


FAST = ModelOptions(backend="system", ctx_size=2048, args="--temp 0", temperature=0.2, pinned=True)
PLAIN = ModelOptions(backend="system")


def test_round_trip_save_export_wipe_import_load(
    standin_settings: Settings, tmp_path: Path, lemon_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models"
    standin_settings = dataclasses.replace(standin_settings, max_loaded_models=2)

    async def save() -> list[str]:
        async with Router(standin_settings) as router:
            paths = [make_standin_model(models, n) for n in ("alpha", "beta")]
            names = [router.library.import_path(path).name for path in paths]
            router.save_options(names[0], FAST)
            router.set_pinned(names[0], True)
            router.save_options(names[1], PLAIN)
            for name in names:
                await router.load(name)
            saved = router.collections.save("kit")  # the loaded models
            assert sorted(saved.model_names) == sorted(names)
            return names

    alpha, beta = asyncio.run(save())
    listed = cli_json(capsys, "collections")["collections"]
    assert [(c["name"], sorted(c["models"])) for c in listed] == [("kit", sorted([alpha, beta]))]

    exported = tmp_path / "kit.json"
    code, out, err = cli(capsys, "collections", "export", "kit", str(exported))
    assert code == 0 and "Exported kit" in out, err
    data = json.loads(exported.read_text())
    assert (data["model_name"], data["recipe"]) == ("user.kit", "collection.omni")
    assert sorted(data["components"]) == sorted([alpha, beta])
    entries = {m["model_name"]: m for m in data["models"]}
    assert entries[alpha]["recipe"] == "llamacpp"
    assert entries[alpha]["checkpoints"] == {"main": str((models / "alpha.gguf").resolve())}
    assert entries[alpha]["recipe_options"] == {
        "ctx_size": 2048,
        "llamacpp_backend": "system",
        "llamacpp_args": "--temp 0",
    }
    assert entries[alpha]["lemon_desk"] == {"temperature": 0.2, "pinned": True}
    assert entries[beta]["recipe_options"] == {"llamacpp_backend": "system"}
    assert "lemon_desk" not in entries[beta]

    shutil.rmtree(lemon_home)  # a new machine, or a fresh start
    assert cli_json(capsys, "collections") == {"collections": []}
    imported = cli_json(capsys, "collections", "import", str(exported))
    assert sorted(imported["registered"]) == sorted([alpha, beta]) and imported["warnings"] == []
    code, out, _ = cli(capsys, "collections")
    assert code == 0 and "kit" in out and alpha in out

    async def load() -> None:
        async with Router(standin_settings) as router:
            assert sorted(await router.collections.load("kit")) == sorted([alpha, beta])
            assert set(router.loaded()) == {alpha, beta}
            request = router.supervisor.engines[alpha].request
            assert (request.backend, request.ctx_size, request.user_args) == ("system", 2048, ("--temp", "0"))
            pins = {m.model.name: m.options.pinned for m in router.collections.get("user.kit").members}
            assert pins == {alpha: True, beta: False}

    asyncio.run(load())
    code, out, _ = cli(capsys, "collections", "rm", "kit")
    assert code == 0 and "its models stay" in out
    assert cli_json(capsys, "collections") == {"collections": []}
    assert {m["name"] for m in cli_json(capsys, "models")["models"]} >= {alpha, beta}


def test_save_needs_models_and_load_names_the_member_that_failed(
    standin_settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "collections", "save", "empty")
    assert code == 1 and "Usage: lemon-desk collections save NAME MODEL..." in err
    code, _, err = cli(capsys, "collections", "save", "../evil", "x")
    assert code == 1 and "cannot name a collection" in err
    code, _, err = cli(capsys, "collections", "load", "nothing")
    assert code == 1 and "There is no collection named nothing" in err
    code, _, err = cli(capsys, "collections", "export", "kit")
    assert code == 1 and "Usage: lemon-desk collections export NAME FILE" in err

    async def go() -> str:
        async with Router(standin_settings) as router:
            good = router.library.import_path(make_standin_model(tmp_path, "good")).name
            bad = router.library.import_path(make_standin_model(tmp_path, "bad", crash_on_load=True)).name
            for name in (good, bad):
                router.save_options(name, PLAIN)
            router.collections.save("mixed", [good, bad])
            with pytest.raises(Exception, match=f"Collection mixed: {bad} did not load"):
                await router.collections.load("mixed")
            return good

    asyncio.run(go())


def test_a_command_loads_no_collection_it_would_stop_at_once_and_serve_keeps_one_loaded(
    standin_settings: Settings, tmp_path: Path, lemon_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`collections load` in a command loaded each model and stopped it as the command ended, saying
    "Loaded"; `save` without models said "No model is loaded", always. Both now say that models stay
    loaded only in the window or `serve`, and `serve --collection` keeps the collection loaded."""
    standin_settings = dataclasses.replace(standin_settings, max_loaded_models=2)
    save_settings(standin_settings)
    library = Library(standin_settings)
    alpha, beta = (library.import_path(make_standin_model(tmp_path, n)).name for n in ("alpha", "beta"))
    crashing = library.import_path(make_standin_model(tmp_path, "crashing", crash_on_load=True)).name
    save_model_options({alpha: FAST, beta: PLAIN, crashing: PLAIN})

    code, _, err = cli(capsys, "collections", "save", "kit")
    assert code == 1 and "only while the window or `lemon-desk serve` runs" in err, err
    assert cli(capsys, "collections", "save", "kit", alpha, beta)[0] == 0
    code, out, err = cli(capsys, "collections", "load", "kit")
    assert (code, out) == (1, "") and "Nothing was loaded" in err, err
    assert "lemon-desk serve --collection kit" in err
    assert not list(lemon_home.glob("logs/engine-*.log"))  # no engine was started

    with serving("--collection", "kit") as served:

        def loaded() -> dict[str, Any]:
            health = httpx.get(f"{served.url}/api/v1/health", trust_env=False).json()
            return {m["model_name"]: m["recipe_options"] for m in health["all_models_loaded"]}

        wait_until(lambda: set(loaded()) == {alpha, beta})
        assert loaded()[alpha]["ctx_size"] == FAST.ctx_size  # with the collection's options

    assert cli(capsys, "collections", "save", "mixed", alpha, crashing)[0] == 0
    with serving("--collection", "mixed") as served:
        assert served.proc.wait(timeout=60) == 1
        assert served.proc.stderr is not None
        assert f"error: Collection mixed: {crashing} did not load" in served.proc.stderr.read()
    code, _, err = cli(capsys, "serve", "--port", "0", "--collection", "nothing")
    assert code == 1 and "There is no collection named nothing" in err  # before anything listens


def test_export_makes_no_folder_and_import_replaces_a_collection_only_when_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "kit.json"
    good.write_text(json.dumps(lemonade_file()))
    assert cli_json(capsys, "collections", "import", str(good))["name"] == "MyKit"
    missing = tmp_path / "no" / "such" / "folder"
    code, _, err = cli(capsys, "collections", "export", "MyKit", str(missing / "kit.json"))
    assert code == 1 and f"the folder {missing} does not exist" in err, err
    assert not (tmp_path / "no").exists()  # it was made, silently, before

    changed = lemonade_file()
    changed["models"][0]["recipe_options"]["ctx_size"] = 1024
    good.write_text(json.dumps(changed))
    code, _, err = cli(capsys, "collections", "import", str(good))
    assert code == 1 and "There is a collection named MyKit here already; nothing was imported" in err
    assert "--replace" in err

    def ctx_size() -> int | None:
        members = Router(Settings()).collections.get("MyKit").members
        return next(m.options.ctx_size for m in members if m.model.name == "Qwen3-0.6B-GGUF")

    assert ctx_size() is None  # -1 in the first file: automatic
    assert cli(capsys, "collections", "import", str(good), "--replace")[0] == 0
    assert ctx_size() == 1024


def lemonade_file() -> dict[str, Any]:
    """A collection file as Lemonade's docs show one, with one of our recipes."""
    return {
        "model_name": "user.MyKit",
        "recipe": "collection.omni",
        "checkpoints": {"main": ""},
        "components": ["Qwen3-0.6B-GGUF", "user.Tiny"],
        "models": [
            {
                "model_name": "Qwen3-0.6B-GGUF",
                "recipe": "llamacpp",
                "checkpoints": {"main": "unsloth/Qwen3-0.6B-GGUF:Q4_0"},
                "labels": ["reasoning"],
                "recipe_options": {"ctx_size": -1, "llamacpp_backend": "vulkan", "llamacpp_args": "-np 2"},
                "size": 0.38,
            },
            {
                "model_name": "user.Tiny",
                "recipe": "lemon-mlx",
                "checkpoints": {"main": "mlx-community/Tiny-4bit"},
                "recipe_options": {"lemon_mlx_backend": "mlx-lm"},
            },
        ],
        "labels": [],
        "recipe_options": {},
    }


def test_a_lemonade_file_reads_with_lemonades_option_keys() -> None:
    collection = collection_from_json(lemonade_file())
    assert collection.name == "MyKit"
    qwen, tiny = collection.members
    assert qwen.options == ModelOptions(backend="vulkan", ctx_size=None, args="-np 2")
    assert (qwen.model.checkpoint, qwen.model.labels, qwen.model.size_gb) == (
        "unsloth/Qwen3-0.6B-GGUF:Q4_0",
        ("reasoning",),
        0.38,
    )
    assert (tiny.model.recipe, tiny.options.backend) == ("lemon-mlx", "mlx-lm")


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


HOSTILE = [
    ((), "not a dict", "the file is not an object"),
    (("model_name",), "user.../../etc", "model_name"),
    (("recipe",), "llamacpp", "not a collection recipe"),
    (("components",), [], "components is not a list"),
    (("components", 1), "user.Other", "has no definition of user.Other"),
    (("models", 0, "model_name"), "../../x", "models[0].model_name"),
    (("models", 0, "recipe"), "sh", "models[0].recipe 'sh' is not a recipe"),
    (("models", 0, "checkpoints", "main"), "../../../etc/passwd", "models[0].checkpoints.main"),
    (("models", 0, "checkpoints", "main"), "/models/../../etc/x.gguf", "not a plain absolute path"),
    (("models", 0, "checkpoints", "main"), "org/repo:../../x", "unusable variant"),
    (("models", 0, "labels"), [1], "models[0].labels"),
    (("models", 0, "size"), "huge", "models[0].size"),
    (("models", 0, "recipe_options", "ctx_size"), "4096", "ctx_size is not a whole number"),
    (("models", 0, "recipe_options", "ctx_size"), True, "ctx_size is not a whole number"),
    (("models", 0, "recipe_options", "llamacpp_backend"), "../bin", "is not a backend name"),
    (("models", 0, "recipe_options", "llamacpp_args"), "--port 1", "--port is set by Lemon Desk"),
    (("models", 0, "recipe_options", "llamacpp_args"), ["-np", "2"], "not a string of engine arguments"),
    (("models", 0, "lemon_desk"), {"shell": "rm -rf"}, "unknown keys 'shell'"),
    (("models", 0, "lemon_desk"), {"temperature": float("nan")}, "temperature is not a"),
    (("models", 0, "lemon_desk"), {"pinned": "yes"}, "pinned is not true or false"),
]


@pytest.mark.parametrize(("path", "value", "says"), HOSTILE)
def test_hostile_collection_files_are_refused_saying_what_is_wrong(
    path: tuple[Any, ...], value: Any, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = value if path == () else _set(lemonade_file(), path, value)
    with pytest.raises(ConfigError, match=r"The collection is not valid|is set by Lemon Desk") as err:
        collection_from_json(doc)
    assert says in str(err.value)
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps(doc))
    code, _, stderr = cli(capsys, "collections", "import", str(hostile))
    assert code == 1 and stderr.startswith("error: ") and "Traceback" not in stderr
    assert not collections_path().exists()  # nothing kept, nothing registered
    assert cli_json(capsys, "collections") == {"collections": []}


def test_files_that_are_not_collections_and_an_unreadable_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, content in (("deep.json", "[" * 100_000), ("big.json", " " * (2 << 20)), ("x.json", "{")):
        (tmp_path / name).write_text(content)
        code, _, err = cli(capsys, "collections", "import", str(tmp_path / name))
        assert code == 1 and "Traceback" not in err, err
    code, _, err = cli(capsys, "collections", "import", str(tmp_path / "missing.json"))
    assert code == 1 and "Cannot read" in err

    good = tmp_path / "kit.json"
    good.write_text(json.dumps(lemonade_file()))
    imported = cli_json(capsys, "collections", "import", str(good))
    # A bare name Lemon Desk does not know becomes a user model; a known catalog name keeps its entry.
    assert imported["models"][1] == "user.Tiny"
    collections_path().write_text("{ not json")
    code, out, err = cli(capsys, "collections", "--json")
    assert code == 0 and json.loads(out) == {"collections": []}
    assert "collections file was unreadable" in err
    assert list(collections_path().parent.glob("collections.json.*"))  # set aside, not deleted
