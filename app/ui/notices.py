"""What the tray tells of the router's events: a title, a message and whether it is an error, or nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.remotes import RemoteState

if TYPE_CHECKING:
    from app.supervisor.remote_views import RemoteChanged
    from app.supervisor.router import EngineRecovery

Notice = tuple[str, str, bool]  # title, message, is an error


def recovery_notice(event: EngineRecovery) -> Notice:
    title = f"{event.model} stopped" if event.gave_up else f"{event.model} recovering"
    return title, event.message.splitlines()[0], event.gave_up


def remote_notice(event: RemoteChanged) -> Notice | None:
    """Told once per move, not per look: a remote that stays down is one notice."""
    if event.removed or not event.moved or event.state is RemoteState.UNKNOWN:
        return None
    if event.state is RemoteState.REACHABLE:
        if event.old is RemoteState.UNKNOWN:
            return None
        return f"{event.name} is back", f"The remote {event.name} answers again.", False
    return f"{event.name} is {event.state.value}", event.message, True
