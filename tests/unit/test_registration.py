"""A user model defined by Lemonade's registration fields: what each field becomes, what is refused and
why, and how a definition meets a name the library knows already (``Library.define``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from app.core.errors import ConfigError, ModelError
from app.core.models import Model
from app.core.registration import defines_model, user_model_from_request
from app.store.library import Library
from app.store.settings import Settings

BASE = {"model_name": "user.Gemma-Vision", "checkpoint": "org/gemma-GGUF:Q4_K_M", "recipe": "llamacpp"}


def test_the_fields_become_a_user_model() -> None:
    model = user_model_from_request(
        {**BASE, "mmproj": "mmproj-f16.gguf", "vision": True, "reasoning": False, "labels": ["hot"]}
    )
    assert model == Model(
        "user.Gemma-Vision",
        "llamacpp",
        "org/gemma-GGUF:Q4_K_M",
        ("hot", "vision"),
        user=True,
        mmproj="mmproj-f16.gguf",
    )


def test_checkpoints_by_role_say_the_same() -> None:
    roles = {"main": "org/gemma-GGUF:Q4_K_M", "mmproj": "org/gemma-GGUF:mmproj-f16.gguf"}
    model = user_model_from_request({"model_name": "user.G", "recipe": "llamacpp", "checkpoints": roles})
    assert (model.checkpoint, model.mmproj) == ("org/gemma-GGUF:Q4_K_M", "mmproj-f16.gguf")


def test_embedding_is_the_embeddings_label_and_one_mode_is_fine() -> None:
    model = user_model_from_request({**BASE, "embedding": True, "labels": ["embedding"]})
    assert model.labels == ("embeddings",)
    assert user_model_from_request({**BASE, "labels": ["chat", "vision"]}).labels == ("chat", "vision")


def test_a_pull_defines_a_model_only_with_a_recipe_or_checkpoint() -> None:
    assert not defines_model({"model_name": "user.X", "stream": True, "vision": True})
    assert defines_model({"model_name": "user.X", "checkpoint": "a/b"})
    assert defines_model({"model_name": "user.X", "recipe": "llamacpp"})


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"model_name": None}, "'model_name' is required"),
        ({"model_name": 7}, "'model_name'"),
        ({"model_name": "user.a/b"}, "not a model name"),
        ({"model_name": "user..hidden"}, "not a model name"),
        ({"model_name": "Gemma"}, "user namespace"),
        ({"recipe": None}, "'recipe' is required"),
        ({"recipe": "flm"}, "does not run"),
        ({"checkpoint": None}, "'checkpoint' is required"),
        ({"checkpoint": "/home/me/model.gguf"}, "Hugging Face reference"),
        ({"checkpoint": "org/repo:../../x"}, "variant"),
        ({"mmproj": "sub/../../p.gguf"}, "'mmproj'"),
        ({"mmproj": "projector.bin"}, "'mmproj'"),
        ({"labels": ["Bad Label"]}, "not a label"),
        ({"labels": ["image"]}, "cannot serve 'image'"),
        ({"reranking": True, "embedding": True}, "two modes"),
        ({"reasoning": 1}, "'reasoning' must be true or false"),
        ({"source": "modelscope"}, "Hugging Face only"),
        ({"checkpoints": {"main": "org/gemma-GGUF:Q8_0"}}, "differs from 'checkpoint'"),
        ({"checkpoints": {"vae": "org/x"}}, "'vae'"),
        ({"recipe": "lemon-mlx"}, "variant"),
    ],
)
def test_refusals_name_the_field(change: dict[str, Any], said: str) -> None:
    body = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        user_model_from_request(body)
    assert said in str(err.value)


def test_a_known_model_may_be_named_outside_the_user_namespace() -> None:
    body = {
        "model_name": "Qwen3-0.6B-GGUF",
        "checkpoint": "unsloth/Qwen3-0.6B-GGUF:Q4_0",
        "recipe": "llamacpp",
    }
    assert user_model_from_request(body, known=True).name == "Qwen3-0.6B-GGUF"


def test_define_keeps_a_name_to_its_files() -> None:
    library = Library(Settings())
    mine = Model("user.Mine", "llamacpp", "org/repo:Q8_0", ("vision",), user=True, mmproj="mmproj-f16.gguf")
    assert library.define(mine) is mine  # a new name
    library.register(mine)
    relabelled = library.define(Model("user.Mine", "llamacpp", "org/repo:Q8_0", ("reasoning",), user=True))
    assert relabelled.labels == ("reasoning",) and relabelled.mmproj == "mmproj-f16.gguf"
    with pytest.raises(ModelError, match="already registered with other files") as err:
        library.define(Model("user.Mine", "llamacpp", "org/repo:Q4_0", user=True))
    assert "Q8_0" in str(err.value) and "Q4_0" in str(err.value)
    with pytest.raises(ModelError, match="mmproj"):
        library.define(dataclasses.replace(mine, mmproj="mmproj-f32.gguf"))
    catalog = library.catalog["Qwen3-0.6B-GGUF"]
    assert library.define(Model(catalog.name, catalog.recipe, catalog.checkpoint)) is catalog
