"""Images and files on the real llama-server: SmolLM2 with a projector made for the tests (random weights,
tests/support/projector.py: the engine's whole image path runs, what the model says of the picture means
nothing), loaded by the router with ``--mmproj`` from a Hugging Face cache repo that names it; files are
counted by the engine's own tokenizer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.core.errors import RequestError
from app.store.attachments import AttachmentStore, expand_messages, ingest
from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, load_settings, save_settings
from app.supervisor.router import Router
from tests.conftest import profile_path
from tests.support.documents import write_image
from tests.support.projector import IMAGE_TOKENS, PROJECTOR_FILE, vision_model_in_cache

pytestmark = pytest.mark.integration

QUESTION = "What is in this picture?"


@pytest.fixture
def vision_home(
    llama_dir: Path, smol_gguf: Path, lemon_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(llama_dir))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    settings = Settings(llama_server_path=str(llama_dir / "llama-server"))
    save_settings(settings)
    library = Library(settings)
    model = vision_model_in_cache(library.cache_root, smol_gguf)
    library.register(model)
    save_model_options({model.name: ModelOptions(backend="system", ctx_size=2048)})
    return model.name


def test_an_image_goes_through_the_engines_projector_and_a_file_is_counted_by_its_tokenizer(
    vision_home: str, tmp_path: Path
) -> None:
    name = vision_home
    store = AttachmentStore(tmp_path / "attachments")
    picture = ingest(write_image(tmp_path / "photo.jpg", 1600, 1200, "JPEG"))  # scaled down first
    store.put(picture.data)
    notes = tmp_path / "notes.md"
    notes.write_text("# Shopping\n\n- apples\n- flour\n- eggs\n")
    text = ingest(notes)

    async def go() -> None:
        async with Router(load_settings().settings) as router:
            view = router.status(name)
            assert view.sees_images and view.files.local and view.files.local.mmproj
            assert view.files.local.mmproj.name == PROJECTOR_FILE
            estimated = await router.count_tokens(name, text.text)
            assert not estimated.exact and estimated.context == 2048  # not loaded: never loaded to count
            engine = await router.ensure_loaded(name)
            assert "--mmproj" in engine.argv
            assert "loaded multimodal model" in engine.last_output(400)
            counted = await router.count_tokens(name, text.text)
            async with router.client(name) as client:
                answer = await client.post_json("/tokenize", {"content": text.text, "add_special": False})
            assert counted.exact and counted.tokens == len(answer["tokens"]) and counted.context == 2048

            plain = [{"role": "user", "content": QUESTION}]
            without = await router.chat(name, plain, max_tokens=4, temperature=0)
            sent = expand_messages(store, [{**plain[0], "attachments": [picture.ref]}])
            content = sent[0]["content"]
            assert isinstance(content, list) and content[1]["type"] == "image_url"
            assert content[1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
            seen = await router.chat(name, sent, max_tokens=4, temperature=0)
            # The projector's 16 embeddings took their place in the prompt: the image path ran.
            assert seen.telemetry.prompt_tokens - without.telemetry.prompt_tokens >= IMAGE_TOKENS
            assert seen.telemetry.completion_tokens > 0

    asyncio.run(go())


def test_a_model_without_a_projector_is_refused_images_by_the_engine_too(
    vision_home: str, llama_dir: Path, smol_gguf: Path, tmp_path: Path
) -> None:
    """What the window refuses before sending, the engine refuses as well: the check is not cosmetic."""
    settings = Settings(llama_server_path=str(llama_dir / "llama-server"))
    plain = Library(settings).import_path(smol_gguf, name="user.plain")
    save_model_options(
        {
            vision_home: ModelOptions(backend="system", ctx_size=2048),
            plain.name: ModelOptions(backend="system"),
        }
    )
    store = AttachmentStore(tmp_path / "attachments")
    picture = ingest(write_image(tmp_path / "photo.png", 40, 40))
    store.put(picture.data)
    message = expand_messages(store, [{"role": "user", "content": QUESTION, "attachments": [picture.ref]}])

    async def go() -> None:
        async with Router(settings) as router:
            assert not router.status(plain.name).sees_images
            with pytest.raises(RequestError) as refused:
                await router.chat(plain.name, message, max_tokens=4)
            assert "image input is not supported" in str(refused.value)

    asyncio.run(go())
