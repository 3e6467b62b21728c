"""Disturbances and events that happen to a plant (core layer).

One set of types for every plant representation: the admission-loop fluid plant
(:class:`tokenfactory.plant_models.fluid.LoopScenario`) takes demand steps, decode-rate dips and
lost decode workers; the pool model takes demand steps; the request simulator
(:class:`tokenfactory.plant_models.des.ClusterConfig`) takes worker crashes, link slowdowns,
decode-rate dips and reconfigurations. Each plant says which kinds it accepts
(:func:`events_from_dicts` ``allowed``) and rejects the others.

Every event validates its fields on construction (:class:`ConfigError` naming ``kind.field``);
:func:`events_from_dicts` builds events from TOML/JSON tables (``kind = "worker_crash"`` plus the
fields) and names the failing table (``cluster.events[2].pool``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tokenfactory.core.errors import ConfigError
from tokenfactory.core.signals import POOLS
from tokenfactory.core.validation import REQUIRED, check_fields, reject_unknown_keys, setting

__all__ = ["DemandStep", "DecodeRateDip", "DecodeWorkersLost", "WorkerCrash", "LinkSlowdown", "Reconfiguration",
           "EVENT_KINDS", "events_from_dicts"]


@dataclass(frozen=True)
class DemandStep:
    """Demand multiplied by ``factor`` from ``at_s`` on.

    Parameters
    ----------
    at_s : float
        When the step happens (s, >= 0).
    factor : float
        Demand multiplier (>= 0; 1.5 = 50 % more).
    """

    kind: ClassVar[str] = "demand_step"
    at_s: float = setting(REQUIRED, unit="s", low=0.0, meaning="when the step happens")
    factor: float = setting(REQUIRED, low=0.0, meaning="demand multiplier from then on (1.5 = 50 % more)")

    def __post_init__(self) -> None:
        check_fields(self, self.kind, hold=False)


@dataclass(frozen=True)
class _FactorWindow:
    """Something runs at ``factor`` x its normal speed in [start_s, start_s + duration_s).

    Parameters
    ----------
    start_s : float
        Start of the window (s, >= 0).
    duration_s : float
        Its length (s, >= 0).
    factor : float
        Speed multiplier in the window (> 0; 0.7 = 30 % slower).
    """

    kind: ClassVar[str] = "factor_window"
    start_s: float = setting(REQUIRED, unit="s", low=0.0, meaning="start of the window")
    duration_s: float = setting(REQUIRED, unit="s", low=0.0, meaning="length of the window")
    factor: float = setting(REQUIRED, low=0.0, low_inclusive=False,
                            meaning="speed (decode rate, or KV link bandwidth) multiplier in the window (0.7 = 30 % "
                                    "slower)")

    def __post_init__(self) -> None:
        check_fields(self, self.kind, hold=False)


@dataclass(frozen=True)
class DecodeRateDip(_FactorWindow):
    """Decode speed multiplied by ``factor`` (e.g. 0.7 = a 30 % dip) in [start_s, start_s + duration_s).

    Parameters
    ----------
    start_s : float
        Start of the dip (s, >= 0).
    duration_s : float
        Its length (s, >= 0).
    factor : float
        Decode speed multiplier (> 0).
    """

    kind: ClassVar[str] = "decode_rate_dip"


@dataclass(frozen=True)
class DecodeWorkersLost:
    """``fraction`` of decode workers lost at ``at_s`` (their sequences are re-queued).

    Parameters
    ----------
    at_s : float
        When the workers are lost (s, >= 0).
    fraction : float
        Share of the decode pool lost, in [0, 1].
    """

    kind: ClassVar[str] = "decode_workers_lost"
    at_s: float = setting(REQUIRED, unit="s", low=0.0, meaning="when the workers are lost")
    fraction: float = setting(REQUIRED, low=0.0, high=1.0, meaning="share of the decode pool lost (its sequences are "
                                                                   "re-queued)")

    def __post_init__(self) -> None:
        check_fields(self, self.kind, hold=False)


@dataclass(frozen=True)
class WorkerCrash:
    """Worker ``index`` of ``pool`` crashes at ``at_s`` and restarts after ``restart_s``; the
    requests it held lose their state and are re-queued.

    Parameters
    ----------
    at_s : float
        When it crashes (s, >= 0).
    pool : str
        ``"fill"`` or ``"decode"``.
    index : int
        Which worker of the pool (>= 0; no effect if the pool is smaller).
    restart_s : float
        Time until it serves again (s, >= 0).
    """

    kind: ClassVar[str] = "worker_crash"
    at_s: float = setting(REQUIRED, unit="s", low=0.0, meaning="when the worker crashes")
    pool: str = setting("decode", kind=str, choices=POOLS, meaning="the pool of the crashing worker")
    index: int = setting(0, kind=int, low=0, meaning="which worker of the pool (no effect if the pool is smaller)")
    restart_s: float = setting(30.0, unit="s", low=0.0, meaning="time until it serves again (its requests lose "
                                                                "their state and are re-queued)")

    def __post_init__(self) -> None:
        check_fields(self, self.kind, hold=False)


@dataclass(frozen=True)
class LinkSlowdown(_FactorWindow):
    """KV links run at ``factor`` x bandwidth in [start_s, start_s + duration_s).

    Parameters
    ----------
    start_s : float
        Start of the slowdown (s, >= 0).
    duration_s : float
        Its length (s, >= 0).
    factor : float
        Bandwidth multiplier (> 0).
    """

    kind: ClassVar[str] = "link_slowdown"


@dataclass(frozen=True)
class Reconfiguration:
    """At ``at_s`` move ``count`` workers from pool ``source`` to ``target``: each drains its
    work, is offline for ``downtime_s``, then serves the other pool.

    Parameters
    ----------
    at_s : float
        When the move starts (s, >= 0).
    source, target : str
        ``"fill"`` and ``"decode"``, one each.
    count : int
        Workers moved (>= 1).
    downtime_s : float
        Offline time between draining and serving the target pool (s, >= 0).
    """

    kind: ClassVar[str] = "reconfiguration"
    at_s: float = setting(REQUIRED, unit="s", low=0.0, meaning="when the move starts")
    source: str = setting(REQUIRED, kind=str, choices=POOLS, meaning="the pool workers leave")
    target: str = setting(REQUIRED, kind=str, choices=POOLS, meaning="the pool they join (the other one)")
    count: int = setting(1, kind=int, low=1, unit="workers", meaning="workers moved")
    downtime_s: float = setting(60.0, unit="s", low=0.0, meaning="offline time between draining and serving the "
                                                                 "target pool")

    def __post_init__(self) -> None:
        check_fields(self, self.kind, names=("at_s", "source", "target"), hold=False)
        if self.source == self.target:
            raise ConfigError(f"{self.kind}.target", f"a move goes to the other pool, not {self.target!r} again")
        check_fields(self, self.kind, names=("count", "downtime_s"), hold=False)


#: every event kind by the name scenario files use
EVENT_KINDS: dict[str, type] = {k.kind: k for k in (DemandStep, DecodeRateDip, DecodeWorkersLost, WorkerCrash,
                                                     LinkSlowdown, Reconfiguration)}


def events_from_dicts(items: Iterable[Any], where: str, allowed: Iterable[str]) -> tuple:
    """Events from tables (``{"kind": "worker_crash", "at_s": 20.0, ...}``) or event objects.

    Parameters
    ----------
    items : iterable
        Mappings with a ``kind`` key and the event's fields, or event objects.
    where : str
        Dotted path of the list in the configuration (errors name ``where[i].field``).
    allowed : iterable of str
        The kinds the plant accepts.

    Returns
    -------
    tuple
        The events, in the given order.
    """
    allowed = tuple(allowed)
    out = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            if getattr(type(item), "kind", None) not in allowed or not dataclasses.is_dataclass(item):
                raise ConfigError(at, f"{item!r} is not one of the accepted events ({', '.join(allowed)})")
            out.append(item)
            continue
        item = dict(item)
        kind = item.pop("kind", None)
        if kind not in allowed:
            raise ConfigError(f"{at}.kind", f"{kind!r} is not one of {', '.join(allowed)}")
        cls = EVENT_KINDS[kind]
        reject_unknown_keys(at, item, {f.name for f in dataclasses.fields(cls)})
        try:
            out.append(cls(**item))
        except ConfigError as e:  # name the table, not just the kind
            raise ConfigError(f"{at}.{e.field.split('.', 1)[-1]}", str(e).split(": ", 1)[-1]) from None
        except TypeError as e:  # a required field is missing
            raise ConfigError(at, str(e)) from None
    return tuple(out)
