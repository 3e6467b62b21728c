"""One resolver for every study's configuration: named variants, unknown keys rejected by name.

Every study declares its settings once as :class:`StudyVariants` - the default variant's values
(which also name every key the study accepts) and the overrides of its ``quick`` and ``full``
variants (desmod's named config groups: a variant is a partial config applied over the defaults)
- and its ``run`` calls :func:`resolve_study_config` once. The result, a :class:`StudyConfig`, is
read-only, records which variant it is, and is what the study writes into ``metrics.json``.

Precedence, lowest first: the defaults, the chosen variant's overrides, the caller's ``config``.
An unknown key is a :class:`~tokenfactory.core.errors.ConfigError` naming ``study.key``, the
nearest allowed key ("did you mean") and every allowed one.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenfactory.core.validation import ConfigError

__all__ = ["VARIANTS", "StudyVariants", "StudyConfig", "resolve_study_config", "unknown_key_error"]

#: the three sizes of every study (see :mod:`tokenfactory.studies`)
VARIANTS: tuple[str, ...] = ("quick", "default", "full")


def unknown_key_error(where: str, key: str, allowed) -> ConfigError:
    """The error for an unknown key: names it, the closest allowed key and every allowed one.

    Parameters
    ----------
    where : str
        The section (``"overload"``); the error's field is ``where.key``.
    key : str
        The key given.
    allowed : iterable of str
        The keys the section accepts.

    Returns
    -------
    ConfigError
    """
    allowed = sorted(map(str, allowed))
    near = difflib.get_close_matches(str(key), allowed, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return ConfigError(f"{where}.{key}" if where else str(key), f"unknown key; {hint}allowed keys are {', '.join(allowed)}")


class StudyConfig(dict):
    """A study's resolved settings: a read-only dict (so it is written into ``metrics.json`` as
    is) that also says which study and variant it is.

    Attributes
    ----------
    study : str
        The study's name.
    variant : str
        ``"quick"``, ``"default"`` or ``"full"``.
    """

    def __init__(self, study: str, variant: str, values: Mapping[str, Any]):
        super().__init__(values)
        self.study = study
        self.variant = variant

    def _read_only(self, *args, **kwargs):
        raise TypeError(f"the {self.study} study's config is resolved once and read-only; "
                        "pass settings through config=")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _read_only

    def __reduce__(self):
        # pickled and copied as its study, variant and values (the item setters refuse)
        return (StudyConfig, (self.study, self.variant, dict(self)))

    def to_dict(self) -> dict[str, Any]:
        """A plain (mutable) copy."""
        return dict(self)


@dataclass(frozen=True)
class StudyVariants:
    """A study's settings: the default values (every key the study accepts) and the overrides of
    its quick and full variants.

    Parameters
    ----------
    study : str
        The study's name (the section errors name).
    default : mapping
        The default variant (what ``make run`` runs); its keys are the allowed keys.
    quick, full : mapping
        Overrides of the quick and full variants (keys must be among ``default``'s).
    check : callable, optional
        ``check(values)``: the study's own range checks on the resolved values (raises
        ConfigError).
    extra_keys : tuple of str
        Keys accepted besides ``default``'s with no default value (absent unless given).
    merge_tables : tuple of str
        Keys whose value is a table that a caller's table updates key by key (the rest kept from
        the variant) instead of replacing.
    """

    study: str
    default: Mapping[str, Any]
    quick: Mapping[str, Any] = field(default_factory=dict)
    full: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[dict], None] | None = None
    extra_keys: tuple[str, ...] = ()
    merge_tables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("quick", "full"):
            bad = [k for k in getattr(self, name) if k not in self.allowed]
            if bad:
                raise ConfigError(f"{self.study}.{name}", f"variant overrides unknown keys {bad}")

    @property
    def allowed(self) -> set[str]:
        """Every key the study accepts."""
        return set(self.default) | set(self.extra_keys)

    @property
    def has_full(self) -> bool:
        """Whether the full variant differs from the default."""
        return bool(self.full)


def resolve_study_config(variants: StudyVariants, config: Mapping[str, Any] | None = None, *, quick: bool = False,
                         full: bool = False) -> StudyConfig:
    """Resolve a study's config once: defaults, then the variant's overrides, then ``config``.

    ``config={"full": True}`` selects the full variant like ``full=True`` (for studies whose
    defaults carry a ``full`` key, the resolved value records the choice).

    Parameters
    ----------
    variants : StudyVariants
        The study's declaration.
    config : mapping, optional
        The caller's settings (keyword-style: every key must be one the study accepts).
    quick, full : bool
        The variant (at most one).

    Returns
    -------
    StudyConfig

    Raises
    ------
    ConfigError
        For an unknown key (``study.key``, with the nearest allowed key), both variants at once,
        or whatever the study's ``check`` rejects.
    """
    config = dict(config or {})
    allowed = variants.allowed
    for key in config:
        if key not in allowed:
            raise unknown_key_error(variants.study, key, allowed)
    full = bool(full or config.get("full", False))
    if quick and full:
        raise ConfigError(f"{variants.study}.full", "quick and full are exclusive: pick one variant")
    variant = "quick" if quick else "full" if full else "default"
    values = dict(variants.default)
    if "full" in values:
        values["full"] = full
    values.update(variants.quick if quick else variants.full if full else {})
    for key, value in config.items():
        if key in variants.merge_tables and isinstance(value, Mapping):
            value = {**values[key], **value}
        values[key] = value
    if variants.check is not None:
        variants.check(values)
    return StudyConfig(variants.study, variant, values)
