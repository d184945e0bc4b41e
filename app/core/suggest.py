"""The first model to offer a new user: one of the catalog's suggested models, chosen for this machine.

On a CPU without a GPU the smallest suggested model is offered, since there speed is what a first chat
needs; with a GPU or unified memory, the largest suggested model that fits with room to spare at the
default context. The recipe the machine runs best comes first: MLX on Apple Silicon, GGUF elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.core.fit import SIZE_ONLY, FitEstimate, MemoryKind, Verdict, estimate
from app.core.hardware import Hardware
from app.core.models import Model
from app.core.refs import GGUF_RECIPE, MLX_RECIPE
from app.core.units import GB


@dataclass(frozen=True)
class Choice:
    model: Model
    fit: FitEstimate  # by size alone (the header is not read yet): a lower bound
    reason: str  # why this one, for people


def suggest(models: Iterable[Model], runnable: set[str], hw: Hardware, context: int) -> Choice | None:
    """The suggested catalog model to offer; ``runnable``: recipes with a backend this machine can use."""
    fitting = []
    for model in models:
        if not model.suggested or model.user or model.recipe not in runnable:
            continue
        fit = estimate(int(model.size_gb * GB), SIZE_ONLY, hw, model.recipe, context)
        if fit.verdict is Verdict.FITS:
            fitting.append((model, fit))
    if not fitting:
        return None
    first = MLX_RECIPE if hw.metal.available else GGUF_RECIPE
    if any(m.recipe == first for m, _ in fitting):
        fitting = [(m, f) for m, f in fitting if m.recipe == first]
    fitting.sort(key=lambda pair: (pair[0].size_gb, pair[0].name))
    budget = fitting[0][1].budget
    fmt = "MLX" if fitting[0][0].recipe == MLX_RECIPE else "GGUF"
    if budget.kind is MemoryKind.RAM:
        model, fit = fitting[0]
        reason = (
            f"This machine has no GPU the engines can use, so the model runs on the CPU: the smallest "
            f"suggested {fmt} model answers fastest there."
        )
    else:
        model, fit = fitting[-1]
        where = budget.kind.value + (f" ({budget.device})" if budget.device else "")
        reason = (
            f"The largest suggested {fmt} model that fits in {budget.usable / GB:.0f} GB of {where} with "
            f"room to spare at a {context:,}-token context."
        )
    return Choice(model, fit, reason)
