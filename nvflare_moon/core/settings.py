"""A method's settings as one checked dataclass, and its trip through ``FLModel.meta``.

Each method names, checks and sends its settings in one place: a frozen dataclass (:class:`~.moon.MoonSettings`,
:class:`~.fedssc.FedSSCSettings`, :class:`~.fedsiam_da.FedSiamDASettings`) whose ``__post_init__`` checks every field
with a message that names it. Executors take it whole, as their ``settings`` argument (a nested component in the job's config,
which NVFlare's exporter writes and the site builds back); the Client API recipes send it in every
training model's meta, under ``<prefix><field>`` (``moon_mu``, ``fedssc_mu_glob``, ...), and the helpers read it back
with :func:`settings_from_meta`, so both sides hold the same object.
"""

import dataclasses
from typing import Any, Dict, Iterable, Mapping, Type, TypeVar

Settings = TypeVar("Settings")


def settings_to_meta(settings: Any, prefix: str) -> Dict[str, Any]:
    """``{prefix + field: value}`` for every field of the dataclass ``settings`` (plain Python values)."""
    return {prefix + field.name: getattr(settings, field.name) for field in dataclasses.fields(settings)}


def settings_from_meta(
    cls: Type[Settings], meta: Mapping[str, Any], prefix: str, required: Iterable[str], recipe: str
) -> Settings:
    """The ``cls`` whose fields are in ``meta`` under ``prefix``; a field that is absent takes its default.

    Raises:
        ValueError: a ``required`` field is absent, or a value is not valid; the message names the meta key and the
            recipe that sends it.
    """
    for name in required:
        if prefix + name not in meta:
            raise ValueError(
                f"the received model's meta has no {prefix + name!r}: run this script with {recipe}, which sends the "
                "method's settings with every training model"
            )
    values = {}
    for field in dataclasses.fields(cls):
        if prefix + field.name in meta:
            value = meta[prefix + field.name]
            values[field.name] = value.item() if hasattr(value, "item") else value  # a numpy scalar
    try:
        return cls(**values)
    except ValueError as e:
        raise ValueError(f"the received meta holds an invalid setting (sent by {recipe}): {prefix}{e}") from e


def keep_settings(owner: Any, settings: Settings) -> Settings:
    """Store every field of ``settings`` on ``owner`` under its own name (a recipe's options, as it was given them);
    returns ``settings``."""
    for field in dataclasses.fields(settings):
        setattr(owner, field.name, getattr(settings, field.name))
    return settings
