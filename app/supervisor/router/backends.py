"""Backends as a load needs them (the supervisor's ``LoadOptions`` for a model's recipe options, the
install of the backend a load or this machine's RPC worker will use), and as front ends use them
(``Backends``: their states, installs and removals, a dry run)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.core.backends import BackendKey, BackendKind, BackendState
from app.core.launch import LaunchPlan
from app.core.models import Model
from app.core.rpc import workers_for
from app.store.installs import InstallManifest
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.supervisor import LoadOptions, Supervisor
from app.supervisor.system_info import SystemInfo


def launch_options(settings: Settings, model: Model, options: ModelOptions) -> LoadOptions:
    """What a load of ``model`` with its recipe ``options`` asks of the supervisor: the RPC workers
    are the option's (``local``: none), else the Settings' list for a llama.cpp model."""
    listed = settings.rpc_workers if model.recipe == "llamacpp" else ""
    workers = workers_for(None, options.rpc, listed)
    return LoadOptions(options.backend, options.ctx_size, options.args, tuple(map(str, workers)))


async def install_backend(
    supervisor: Supervisor,
    recipe: str,
    backend: str | None,
    installing: Callable[[str], None] | None = None,
) -> str | None:
    """Install a recipe's backend (None: the best one here) when it is installable or out of date,
    calling ``installing("recipe:backend")`` first; returns its version, None for an unknown one."""
    info = await supervisor.info()
    support = info.recipes.get(recipe)
    backend = backend or (support.default_backend if support else None)
    status = support.backends.get(backend) if support and backend else None
    if status is None or info.versions.spec(recipe, backend or "").kind is BackendKind.SYSTEM:
        return status.version if status else None  # the launch says what is wrong
    if status.state in (BackendState.INSTALLABLE, BackendState.UPDATE_REQUIRED):
        if installing is not None:
            installing(str(BackendKey(recipe, backend or "")))
        await supervisor.install(recipe, backend or "")
    return status.version


class Backends:
    """Backends as front ends use them: the machine and every backend's state, installs and removals,
    and the command a load would run."""

    def __init__(self, supervisor: Supervisor, settings: Callable[[], Settings]) -> None:
        self._supervisor = supervisor
        self._settings = settings

    async def info(self) -> SystemInfo:
        """The machine and every backend's state now (probes run in a thread)."""
        return await self._supervisor.info()

    def install(self, key: BackendKey) -> asyncio.Task[InstallManifest]:
        """Start (or join) installing a backend; progress comes as ``InstallProgress`` events."""
        return self._supervisor.install(key.recipe, key.backend)

    def cancel_install(self, key: BackendKey) -> bool:
        return self._supervisor.cancel(f"install:{key}")

    async def uninstall(self, key: BackendKey) -> bool:
        """Remove an installed backend; refused while it runs or installs. False when none was there."""
        return await self._supervisor.uninstall(key.recipe, key.backend)

    async def dry_run(self, model: Model, options: ModelOptions, parent_env: dict[str, str]) -> LaunchPlan:
        """The command and the variables a load of ``model`` would use, per-launch secrets masked."""
        return await self._supervisor.dry_run(
            model, launch_options(self._settings(), model, options), parent_env
        )
