"""Up-front validation of configuration: one error type naming the field and its allowed range.

Every descriptor, scenario and controller is resolved once from plain mappings (TOML, JSON,
keyword arguments) through these helpers, so a bad value fails at load time with a message a
capacity engineer can act on, never as a traceback from deep inside numpy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from tokenfactory.core.errors import ConfigError

__all__ = [
    "ConfigError",
    "load_toml",
    "check_number",
    "check_int",
    "check_choice",
    "reject_unknown_keys",
    "config_or_fields",
    "setting",
    "resolve_config",
    "config_schema",
    "REQUIRED",
    "setting_names",
    "check_settings",
    "check_fields",
    "inherited_setting",
]

#: the default of a :func:`setting` a file must give (no default)
REQUIRED = dataclasses.MISSING




def _fmt(x: float) -> str:
    return f"{x:g}"


def check_number(field: str, value: Any, *, low: float | None = None, high: float | None = None,
                 low_inclusive: bool = True, high_inclusive: bool = True, allow_inf: bool = False) -> float:
    """Return ``value`` as a float inside [low, high] or raise :class:`ConfigError`.

    NaN is always rejected; +inf only with ``allow_inf`` (for "no limit" settings). Booleans are
    rejected although Python counts them as numbers (``True`` is not a rate).

    Parameters
    ----------
    field : str
        Dotted path of the setting (``"fluid.measurement_delay_s"``), used in the error message.
    value : any
        The value read from the configuration; must be an ``int`` or a ``float``.
    low, high : float, optional
        Bounds of the allowed range, in the setting's own unit; ``None`` (default) is unbounded.
    low_inclusive, high_inclusive : bool
        Whether ``low``/``high`` themselves are allowed (default True: a closed interval).
    allow_inf : bool
        Accept ``+inf`` (default False); ``-inf`` is always rejected.

    Returns
    -------
    float
        ``value`` as a float.

    Raises
    ------
    ConfigError
        When ``value`` is not a number, is NaN or infinite, or lies outside the range; the message
        names ``field`` and prints the range in interval notation (``(0, inf)``).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, f"expected a number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) or (allow_inf and v == math.inf)):
        raise ConfigError(field, f"expected a finite number, got {value!r}")
    lo_ok = low is None or (v >= low if low_inclusive else v > low)
    hi_ok = high is None or (v <= high if high_inclusive else v < high)
    if not (lo_ok and hi_ok):
        lb = "-inf" if low is None else _fmt(low)
        hb = "inf" if high is None else _fmt(high)
        lbr = "[" if low_inclusive and low is not None else "("
        hbr = "]" if high_inclusive and high is not None else ")"
        raise ConfigError(field, f"{_fmt(v)} is outside the allowed range {lbr}{lb}, {hb}{hbr}")
    return v


def check_int(field: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as an int inside [low, high] or raise :class:`ConfigError`.

    A float with an integral value (``4.0``, as TOML and JSON may give) is accepted; ``4.5`` and
    booleans are not.

    Parameters
    ----------
    field : str
        Dotted path of the setting, used in the error message.
    value : any
        The value read from the configuration.
    low, high : int, optional
        Inclusive bounds; ``None`` (default) is unbounded.

    Returns
    -------
    int
        ``value`` as an int.

    Raises
    ------
    ConfigError
        When ``value`` is not an integer or lies outside [low, high].
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)) \
            or float(value) != int(value):
        raise ConfigError(field, f"expected an integer, got {value!r}")
    check_number(field, value, low=low, high=high)
    return int(value)


def check_choice(field: str, value: Any, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise :class:`ConfigError`.

    Parameters
    ----------
    field : str
        Dotted path of the setting, used in the error message.
    value : any
        The value read from the configuration (compared with ``==``, so case matters).
    choices : iterable of str
        The allowed values (a mapping's keys work); the message lists them in this order.

    Returns
    -------
    str
        ``value`` unchanged.

    Raises
    ------
    ConfigError
        When ``value`` is not among ``choices``.
    """
    choices = list(choices)
    if value not in choices:
        raise ConfigError(field, f"{value!r} is not one of {', '.join(map(repr, choices))}")
    return value


def reject_unknown_keys(where: str, mapping: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Raise :class:`ConfigError` for the first key of ``mapping`` not in ``allowed``.

    Unknown keys are errors, not warnings: a misspelt setting would otherwise silently run with
    its default.

    Parameters
    ----------
    where : str
        Dotted path of the section holding the keys (``"plant"``); the error names
        ``where.key``, or just the key when ``where`` is empty.
    mapping : mapping of str
        The section as read (only its keys are checked).
    allowed : iterable of str
        The keys the section accepts; the message lists them sorted.

    Raises
    ------
    ConfigError
        For the first key, in ``mapping``'s order, that is not allowed.
    """
    allowed = set(allowed)
    for key in mapping:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}" if where else str(key),
                              f"unknown key; allowed keys are {', '.join(sorted(allowed))}")


#: keys whose string value may name another file (a model or hardware TOML, a trace)
_PATH_KEYS = frozenset({"model", "hardware", "trace"})
_PATH_SUFFIXES = (".toml", ".csv", ".jsonl", ".json")


def _resolve_file_paths(doc, base):
    """A relative file path under a path key (``model = "my_model.toml"``) names a file beside the
    document, not one in the shell's folder: rewrite it against ``base`` (presets and absolute
    paths are kept)."""
    from pathlib import Path

    if isinstance(doc, dict):
        return {k: (str(base / v) if k in _PATH_KEYS and isinstance(v, str) and v.endswith(_PATH_SUFFIXES)
                    and not Path(v).is_absolute() else _resolve_file_paths(v, base)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_resolve_file_paths(v, base) for v in doc]
    return doc


def load_toml(path, field: str = "scenario") -> dict:
    """Read a TOML configuration file, turning a missing file or bad TOML into a clear error.

    Parameters
    ----------
    path : str or Path
        The file.
    field : str
        The field a missing file is reported under (default ``"scenario"``).

    Returns
    -------
    dict
        The parsed document; a relative file path under a ``model``, ``hardware`` or ``trace`` key
        (ending in ``.toml``, ``.csv``, ``.jsonl`` or ``.json``) is made relative to the file's
        folder, so a scenario names its model file the same way from any working directory.

    Raises
    ------
    ConfigError
        When the file does not exist (field ``field``) or is not valid TOML (field: the file
        name, with the parser's line and column).
    """
    import tomllib
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise ConfigError(field, f"file {str(path)!r} does not exist")
    try:
        with path.open("rb") as fh:
            return _resolve_file_paths(tomllib.load(fh), path.resolve().parent)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path.name, f"not valid TOML: {exc}") from None


def setting(default: Any = None, *, kind: type | str = float, meaning: str, unit: str = "", low: float | None = None,
            high: float | None = None, low_inclusive: bool = True, high_inclusive: bool = True,
            also: tuple[str, ...] = (), choices: tuple[str, ...] = (), source: str = "") -> Any:
    """A field of a typed config (a frozen dataclass): its default and, as field metadata, its type,
    unit, allowed range and one-line meaning, so the config validates itself
    (:func:`resolve_config`) and describes itself (:func:`config_schema`).

    Parameters
    ----------
    default : object
        The value when the key is absent (``None``: the builder's own default, named in ``meaning``;
        :data:`REQUIRED`: the key must be given).
    kind : type or str
        ``float``, ``int``, ``bool`` or ``str``; or a label for what :func:`resolve_config` does
        not check itself (``"table"``, ``"list of tables"``, ``"preset or table"``): the reader
        that owns the setting checks such values.
    meaning : str
        One line: what the setting is.
    unit : str
        The unit (``"s"``, ``"requests/s"``, ``""`` for a ratio).
    low, high : float, optional
        The allowed range.
    low_inclusive, high_inclusive : bool
        Whether the range's ends are allowed.
    also : tuple of str
        Strings allowed besides a number (``("auto",)``).
    choices : tuple of str
        The allowed values of a ``str`` setting.
    source : str
        Where a default constant comes from (a datasheet, a paper, an upstream default).

    Returns
    -------
    dataclasses.Field
        Used as a dataclass field, or as a value of a ``{key: setting(...)}`` mapping: the schema of
        a table read as a plain mapping (:func:`config_schema` takes either).
    """
    meta = {"kind": kind, "meaning": meaning, "unit": unit, "low": low, "high": high, "low_inclusive": low_inclusive,
            "high_inclusive": high_inclusive, "also": tuple(also), "choices": tuple(choices), "source": source}
    return dataclasses.field(default=default, metadata=meta)


def inherited_setting(cls: type, name: str, default: Any) -> Any:
    """A subclass's field that keeps the :func:`setting` declaration of ``name`` in ``cls`` (type,
    unit, range, meaning, source) with another default: a config that extends another redeclares
    only the default it changes.

    Parameters
    ----------
    cls : type
        The dataclass that declares ``name`` with :func:`setting`.
    name : str
        The field.
    default : object
        The subclass's default.

    Returns
    -------
    dataclasses.Field
        Used as the subclass's field (its place in the field order stays the base class's).

    Raises
    ------
    KeyError
        When ``cls`` has no field ``name`` declared with :func:`setting`.
    """
    f = {f.name: f for f in dataclasses.fields(cls)}.get(name)
    if f is None or "meaning" not in f.metadata:
        raise KeyError(f"{cls.__name__}.{name} is not declared with setting()")
    return dataclasses.field(default=default, metadata=f.metadata)


def _resolve_value(where: str, value: Any, meta: Mapping[str, Any]) -> Any:
    if isinstance(value, str) and value in meta["also"]:
        return value
    kind = meta["kind"]
    if isinstance(kind, str):  # a table or list: its reader checks it
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, f"expected true or false, got {value!r}")
        return value
    if kind is str:
        return check_choice(where, value, meta["choices"]) if meta["choices"] else str(value)
    if kind is int:
        return check_int(where, value, low=meta["low"], high=meta["high"])
    if isinstance(value, str) and meta["also"]:
        raise ConfigError(where, f"expected a number or one of {', '.join(map(repr, meta['also']))}, got {value!r}")
    number = check_number(where, value, low=meta["low"], high=meta["high"], low_inclusive=meta["low_inclusive"],
                          high_inclusive=meta["high_inclusive"])
    # keep an integer the user wrote as one (reports show what was configured)
    return value if isinstance(value, int) else number


def resolve_config(cls: type, mapping: Mapping[str, Any], where: str) -> Any:
    """Fill and validate a typed config once: unknown keys rejected by name, every given value
    checked against its field's type and range (:func:`setting`), absent ones at their defaults.

    Parameters
    ----------
    cls : type
        A frozen dataclass whose fields are :func:`setting` s.
    mapping : mapping
        The parsed table (TOML, JSON, keyword arguments).
    where : str
        The table's dotted name for error messages (``"layers.admission"``).

    Returns
    -------
    object
        An instance of ``cls``.

    Raises
    ------
    ConfigError
        Naming the field and its allowed range or the allowed keys.
    """
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    reject_unknown_keys(where, mapping, fields)
    values = {k: _resolve_value(f"{where}.{k}" if where else k, v, fields[k].metadata) for k, v in mapping.items()}
    return cls(**values)


def _setting_fields(spec: Any) -> list[tuple[str, Any]]:
    if isinstance(spec, Mapping):
        return list(spec.items())
    return [(f.name, f) for f in dataclasses.fields(spec) if f.init]


def setting_names(spec: Any) -> tuple[str, ...]:
    """The keys a typed config or a ``{key: setting(...)}`` mapping accepts, in declared order
    (what a reader passes to :func:`reject_unknown_keys`).

    Parameters
    ----------
    spec : type or mapping
        A dataclass whose fields are :func:`setting` s, or a mapping of key to :func:`setting`.

    Returns
    -------
    tuple of str
    """
    return tuple(name for name, _ in _setting_fields(spec))


def check_settings(where: str, mapping: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """Check a table read as a plain mapping against its ``{key: setting(...)}`` schema: unknown
    keys rejected naming the allowed ones, each given value checked against its type and range
    (labelled kinds such as ``"table"`` are left to the reader).

    Parameters
    ----------
    where : str
        The table's dotted name (``"plant"``; ``""`` for the top level).
    mapping : mapping
        The table as read.
    spec : mapping
        ``{key: setting(...)}``.

    Returns
    -------
    dict
        The values as checked (numbers as floats unless given as integers).

    Raises
    ------
    ConfigError
        Naming the field and its allowed range or the allowed keys.
    """
    reject_unknown_keys(where, mapping, spec)
    return {k: _resolve_value(f"{where}.{k}" if where else k, v, spec[k].metadata) for k, v in mapping.items()}


def config_schema(cls: Any) -> list[dict[str, Any]]:
    """One row per setting of a typed config: name, type, unit, allowed range, default, meaning
    (what a ``describe schema`` prints).

    Parameters
    ----------
    cls : type or mapping
        A frozen dataclass whose fields are :func:`setting` s, or a ``{key: setting(...)}`` mapping.

    Returns
    -------
    list of dict
        ``required`` is True for a setting without a default; a field declared without
        :func:`setting` metadata raises ``KeyError`` (an undocumented key).
    """
    rows = []
    for name, f in _setting_fields(cls):
        m = f.metadata
        if "meaning" not in m:
            raise KeyError(f"{getattr(cls, '__name__', 'table')}.{name} has no setting() metadata")
        kind = m["kind"]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else (f.default_factory() if f.default is dataclasses.MISSING else f.default)
        rows.append({"name": name, "type": kind if isinstance(kind, str) else kind.__name__, "unit": m["unit"],
                     "low": m["low"], "high": m["high"], "low_inclusive": m["low_inclusive"],
                     "high_inclusive": m["high_inclusive"], "also": list(m["also"]), "choices": list(m["choices"]),
                     "default": default, "required": required, "meaning": m["meaning"],
                     "source": m.get("source", "")})
    return rows


def config_or_fields(where: str, cls: type, config: Any, fields: Mapping[str, Any], *, name: str = "config") -> Any:
    """A constructor's settings, given whole or as fields: ``config`` when it is a ``cls``,
    ``cls(**fields)`` when it is None.

    Parameters
    ----------
    where : str
        The constructor's field prefix in errors (``"hysteretic"``).
    cls : type
        The settings' dataclass.
    config : cls or None
        The settings given whole.
    fields : mapping
        The settings given as keywords.
    name : str
        What the settings are called in errors (``"config"``, ``"spec"``).

    Returns
    -------
    cls

    Raises
    ------
    ConfigError
        When both are given, or ``config`` is not a ``cls``.
    """
    if config is None:
        return cls(**fields)
    if fields:
        raise ConfigError(f"{where}.{next(iter(fields))}", f"give a {name} or its fields, not both")
    if not isinstance(config, cls):
        raise ConfigError(f"{where}.{name}", f"must be a {cls.__name__}")
    return config


def check_fields(obj: Any, where: str, *, names: Iterable[str] | None = None,
                 bounds: Mapping[str, Mapping[str, Any]] | None = None, hold: bool = True) -> None:
    """Validate a frozen config's fields in place against their :func:`setting` declarations (the
    range, type and choices declared once there) and hold the checked values: numbers as floats,
    integers as ints. Meant for ``__post_init__``; a field at a ``None`` default is left as None.

    Parameters
    ----------
    obj : dataclass instance
        The config (frozen: the values are set with ``object.__setattr__``).
    where : str
        The prefix of the fields' names in errors (``"planner"``: ``planner.FIELD``).
    names : iterable of str, optional
        The fields to check (default all of them, in declared order).
    bounds : mapping, optional
        Per field, the declared bounds replaced for this instance (``{"fine_s": {"high": 600.0}}``):
        a range set by another field's value.
    hold : bool
        Set each field to its checked value (default). False only checks: the fields keep the
        values as given (an integer given as one stays an int where the config reports it).

    Raises
    ------
    ConfigError
        Naming ``where.FIELD`` and its allowed range, choices or type.
    """
    fields = {f.name: f for f in dataclasses.fields(obj) if f.init}
    bounds = bounds or {}
    for name in (fields if names is None else names):
        f = fields[name]
        value = getattr(obj, name)
        if value is None and f.default is None:
            continue
        meta = {**f.metadata, **bounds.get(name, {})}
        checked = _resolve_value(f"{where}.{name}", value, meta)
        if not hold:
            continue
        if meta["kind"] is float and not isinstance(checked, str):
            checked = float(checked)
        object.__setattr__(obj, name, checked)
