"""Request classes (core layer): who a request is for, what it is promised, who yields to whom.

Every request carries a class (the request table's ``request_class`` column). A class has its own
time-to-first-token and time-per-output-token SLO and a priority (0 first); a *deferrable* class
may be held at the orchestrator in a holding queue for at most ``max_defer_s`` when the cluster
has no room for it now, instead of being rejected (section 18: "reserve capacity for short
interactive work"; batch work waits for it).

:data:`DEFAULT_CLASSES` are the two classes every plant knows:

* ``interactive`` - a user watching the stream: TTFT <= 2 s and TPOT <= 0.1 s (the SLO of the
  issue-11 trace replays), priority 0, never deferred;
* ``batch`` - offline or background work (evaluations, document pipelines, agents' non-streaming
  calls): TTFT <= 30 s, TPOT <= 0.2 s, priority 1, deferrable for up to 20 s. These SLOs are an
  ASSUMPTION (no public trace states a batch class's latency promise; batch APIs such as OpenAI's
  promise completion within 24 h, which would never bind here) chosen so that a batch request
  still finishes within a minute or two.

:data:`DEFAULT_CLASS_MIX` is the documented share of each class in traces that do not say
(Azure 2023, Mooncake, synthetic): 80 % interactive, 20 % batch, drawn per request from a
generator seeded by the trace's name (an ASSUMPTION: the published traces carry no class and no
public source gives the background share of such a service; the agentic-coding trace, which
does say - its streaming calls are interactive - has 17 % streaming and 83 % non-streaming
calls, so the share varies widely by workload).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tokenfactory.core.validation import REQUIRED, ConfigError, check_fields, reject_unknown_keys, setting

__all__ = ["RequestClass", "DEFAULT_CLASSES", "DEFAULT_CLASS_MIX", "INTERACTIVE", "BATCH", "class_table",
           "classes_from_dict", "CLASS_SCHEMA"]

INTERACTIVE = "interactive"
BATCH = "batch"


@dataclass(frozen=True)
class RequestClass:
    """One class of requests and its promise.

    Parameters
    ----------
    name : str
        The class's name (what the ``request_class`` column holds).
    slo_ttft_s : float
        Time-to-first-token SLO (s, > 0).
    slo_tpot_s : float
        Time-per-output-token SLO (s, > 0).
    priority : int
        0 is served first; higher numbers yield fill steps and decode slots to lower ones (>= 0).
    deferrable : bool
        Whether the orchestrator may hold a request of this class in a holding queue instead of
        rejecting it (default False).
    max_defer_s : float
        Longest a deferred request is held before it is rejected (reason ``deferral_expired``;
        s, >= 0; default 0).
    """

    name: str = setting(REQUIRED, kind=str, meaning="the class's name (what the trace's request_class column holds)")
    slo_ttft_s: float = setting(REQUIRED, unit="s", low=0.0, low_inclusive=False,
                                meaning="time-to-first-token SLO (a new class must give it; a default class keeps "
                                        "its own)")
    slo_tpot_s: float = setting(REQUIRED, unit="s", low=0.0, low_inclusive=False,
                                meaning="time-per-output-token SLO (a new class must give it)")
    priority: int = setting(0, kind=int, low=0, meaning="0 is served first; higher numbers yield fill steps and "
                                                        "decode slots to lower ones")
    deferrable: bool = setting(False, kind=bool, meaning="whether a request may wait in a holding queue instead of "
                                                         "being rejected")
    max_defer_s: float = setting(0.0, unit="s", low=0.0, meaning="longest a deferred request is held before it is "
                                                                 "rejected (reason deferral_expired)")

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("class.name", f"expected a non-empty string, got {self.name!r}")
        w = f"classes.{self.name}"
        check_fields(self, w, names=("slo_ttft_s", "slo_tpot_s"), hold=False)
        if isinstance(self.priority, bool) or int(self.priority) != self.priority or self.priority < 0:
            raise ConfigError(f"{w}.priority", f"expected an integer >= 0, got {self.priority!r}")
        check_fields(self, w, names=("deferrable", "max_defer_s"), hold=False)


#: the two classes every plant knows (see the module notes for the sources of their SLOs)
DEFAULT_CLASSES: tuple[RequestClass, ...] = (
    RequestClass(INTERACTIVE, slo_ttft_s=2.0, slo_tpot_s=0.1, priority=0),
    RequestClass(BATCH, slo_ttft_s=30.0, slo_tpot_s=0.2, priority=1, deferrable=True, max_defer_s=20.0),
)
#: share of each class in a trace that carries none (ASSUMPTION, see the module notes)
DEFAULT_CLASS_MIX: dict[str, float] = {INTERACTIVE: 0.8, BATCH: 0.2}

#: the keys of one ``[classes.NAME]`` table: the RequestClass fields but its name (the table's key)
CLASS_SCHEMA = {f.name: f for f in dataclasses.fields(RequestClass) if f.name != "name"}
_CLASS_KEYS = tuple(CLASS_SCHEMA)


def class_table(classes: Iterable[RequestClass] | None = None) -> dict[str, RequestClass]:
    """Classes by name, highest priority (lowest number) first.

    Parameters
    ----------
    classes : iterable of RequestClass, optional
        Default :data:`DEFAULT_CLASSES`.

    Returns
    -------
    dict
        ``name -> RequestClass``, sorted by priority then name.

    Raises
    ------
    ConfigError
        For an empty table or a name given twice.
    """
    cs = list(DEFAULT_CLASSES if classes is None else classes)
    if not cs:
        raise ConfigError("classes", "at least one request class is needed")
    names = [c.name for c in cs]
    if len(set(names)) != len(names):
        raise ConfigError("classes", f"a class name is given twice: {names}")
    return {c.name: c for c in sorted(cs, key=lambda c: (c.priority, c.name))}


def classes_from_dict(d: Mapping[str, Any], where: str = "classes",
                      base: Iterable[RequestClass] | None = None) -> tuple[RequestClass, ...]:
    """Classes from a scenario table ``[classes.NAME]`` with the :class:`RequestClass` fields.

    A name already in ``base`` (default :data:`DEFAULT_CLASSES`) overrides only the fields it
    gives; a new name needs ``slo_ttft_s`` and ``slo_tpot_s``.

    Parameters
    ----------
    d : mapping
        ``{name: {field: value}}``.
    where : str
        Field path for error messages (default ``"classes"``).
    base : iterable of RequestClass, optional
        The classes the table modifies (default :data:`DEFAULT_CLASSES`).

    Returns
    -------
    tuple of RequestClass
        ``base`` with the table applied, new classes appended.

    Raises
    ------
    ConfigError
        Naming ``classes.NAME.FIELD`` for an unknown field, a missing SLO or a bad value.
    """
    out = {c.name: c for c in (DEFAULT_CLASSES if base is None else base)}
    if not isinstance(d, Mapping):
        raise ConfigError(where, "expected a table of classes")
    for name, fields in d.items():
        if not isinstance(fields, Mapping):
            raise ConfigError(f"{where}.{name}", "expected a table of class fields")
        reject_unknown_keys(f"{where}.{name}", fields, _CLASS_KEYS)
        if name in out:
            cur = out[name]
            kw = {k: fields.get(k, getattr(cur, k)) for k in _CLASS_KEYS}
        else:
            for req in ("slo_ttft_s", "slo_tpot_s"):
                if req not in fields:
                    raise ConfigError(f"{where}.{name}.{req}", "missing (a new class needs both SLOs)")
            kw = dict(fields)
        out[name] = RequestClass(name, **kw)
    return tuple(out.values())
