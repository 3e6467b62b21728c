"""The reference of every file a user writes: each table's keys with type, unit, default, allowed
range and meaning, collected from the :func:`~tokenfactory.core.validation.setting` metadata each
reader declares beside itself (``tokenfactory describe schema``; ``docs/reference.md`` is
generated from it).

Sections: ``model`` (a model TOML or ``plant.model``), ``hardware``, ``scenario`` (``simulate
--scenario``), ``cluster`` (its ``[cluster]``, ``[cluster.dynamics]``, events and classes),
``margins`` (a ``tokenfactory margins`` scenario), ``stack`` (a stack scenario for ``certify``),
``live`` (a live scenario's ``[live]`` table) and ``kinds`` (the parameters of each admission and autoscaler kind). ``tests/test_reference.py``
feeds each reader an undocumented key and compares the keys its error lists with the table here,
so a key a reader accepts cannot go undocumented.

It reads every layer's readers, so it sits at the top, beside the command line. Regenerate the
page with ``python -m tokenfactory.reference --write docs/reference.md`` (``make
reference``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenfactory.core.validation import ConfigError, check_choice, config_schema, setting

__all__ = ["SchemaTable", "SECTIONS", "schema_tables", "render_schema", "reference_page", "main"]

#: the sections of ``describe schema``, with what file each describes
SECTIONS: dict[str, str] = {
    "model": "a model descriptor: a model TOML file, or the inline table of plant.model / decode_model",
    "hardware": "an accelerator descriptor: a hardware TOML file, or the inline table of plant.hardware",
    "scenario": "a scenario file for `tokenfactory simulate --scenario FILE` (request-level replay)",
    "cluster": "the simulated cluster of a scenario file: [cluster], [cluster.dynamics], [[cluster.events]], "
               "[classes.NAME]",
    "margins": "a loop scenario file for `tokenfactory margins FILE` (the fluid plant)",
    "stack": "a stack scenario file for `tokenfactory certify FILE`",
    "live": "a live scenario file (emulator and gateway): a scenario file plus a [live] table",
    "kinds": "the parameters of each admission and autoscaler kind (a scenario's [controller], "
             "`simulate --admission/--autoscaler`)",
}


@dataclass(frozen=True)
class SchemaTable:
    """One table of a user's file and its keys.

    Parameters
    ----------
    section : str
        The section (a key of :data:`SECTIONS`).
    path : str
        The table's name in the file (``"cluster.dynamics"``; ``""`` for a file's top level).
    summary : str
        One line: what the table is.
    rows : list of dict
        :func:`~tokenfactory.core.validation.config_schema` rows.
    selector : str
        The key and value that select this table's keys (``'kind = "worker_crash"'``), if any.
    """

    section: str
    path: str
    summary: str
    rows: list
    selector: str = ""

    @property
    def title(self) -> str:
        """The table as a user writes its header (``[cluster.dynamics]``, ``top level``)."""
        name = f"[{self.path}]" if self.path else "top level"
        return f"{name} {self.selector}".strip()

    def to_dict(self) -> dict[str, Any]:
        """The table as plain data (``--format json``).

        Returns
        -------
        dict
        """
        return {"section": self.section, "table": self.path, "selector": self.selector, "summary": self.summary,
                "keys": [{**r, "default": _jsonable(r["default"])} for r in self.rows]}


def _jsonable(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return dataclasses.asdict(v)
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _event_tables(section: str, path: str, kinds: dict[str, type], summary: str) -> list[SchemaTable]:
    return [SchemaTable(section, path, f"{summary}: {_first_paragraph(cls.__doc__)}",
                        config_schema(cls), f'kind = "{name}"') for name, cls in kinds.items()]


def _first_paragraph(doc: str | None) -> str:
    """A docstring's first paragraph on one line, without its closing period (the page adds one)."""
    return " ".join((doc or "").strip().split("\n\n")[0].split()).rstrip(".")


def _controller_kind_rows() -> list[dict[str, Any]]:
    from tokenfactory.registry import ADMISSION_KINDS

    return config_schema({"kind": setting(None, kind=str, choices=tuple(ADMISSION_KINDS),
                                          meaning="the admission kind; the table's other keys are its parameters "
                                                  "(section kinds: admission.KIND)")})


def schema_tables(section: str | None = None) -> list[SchemaTable]:
    """Every documented table, or one section's.

    Parameters
    ----------
    section : str, optional
        A key of :data:`SECTIONS` (default: all).

    Returns
    -------
    list of SchemaTable

    Raises
    ------
    ConfigError
        For an unknown section (field ``section``).
    """
    if section is not None:
        check_choice("section", section, SECTIONS)
    tables = [*_model_tables(), *_replay_scenario_tables(), *_cluster_tables(), *_margins_tables(),
              *_stack_tables(), *_live_tables(), *_stack_layer_tables(), *_kind_tables()]
    return [t for t in tables if section is None or t.section == section]


def _shared_tables(section: str) -> tuple[SchemaTable, SchemaTable]:
    """A worker's parallelism and efficiency tables, as a section with a ``[plant]`` reads them."""
    from tokenfactory.plant_models.roofline import Efficiency, Parallelism

    return (SchemaTable(section, "plant.parallelism", "the layout of one worker: num_gpus = pp x ep, ep/tp attention "
                        "replicas", config_schema(Parallelism)),
            SchemaTable(section, "plant.efficiency", "fractions of peak a serving stack reaches, and its fixed costs",
                        config_schema(Efficiency)))


def _envelope_table(section: str) -> SchemaTable:
    """The stability envelope a tuned admission must hold (a replay's and a loop scenario's)."""
    from tokenfactory.controllers.autotune import StabilityEnvelope

    return SchemaTable(section, "envelope", "the box of plant errors a tuned controller must tolerate, and its margin "
                       "floors", config_schema(StabilityEnvelope))


def _model_tables() -> list[SchemaTable]:
    """A model file (and its attention table) and a hardware file."""
    from tokenfactory.plant_models.hardware import HARDWARE_SCHEMA
    from tokenfactory.plant_models.moe_model import ATTENTION_SCHEMA, MODEL_SCHEMA

    return [
        SchemaTable("model", "model", "a transformer (mixture-of-experts; a dense one has num_dense_layers = "
                    "num_layers and one nominal routed expert); sizes are "
                    "element counts from the model's config.json; with base = PRESET every key is optional (it "
                    "overrides the preset's)", config_schema(MODEL_SCHEMA)),
        SchemaTable("model", "model.attention", "the attention layers (in a model TOML: [attention])",
                    config_schema(ATTENTION_SCHEMA)),
        SchemaTable("hardware", "hardware", "one GPU in its scale-up domain (SI units); with base = PRESET every key "
                    "is optional (it overrides the preset's)", config_schema(HARDWARE_SCHEMA)),
    ]


def _replay_scenario_tables() -> list[SchemaTable]:
    """A replay scenario (``simulate --scenario``): its sections, plant, controller, envelope, simulation."""
    from tokenfactory.replay_scenario import REPLAY_PLANT_SCHEMA, REPLAY_SCENARIO_SCHEMA, REPLAY_SIMULATION_SCHEMA

    return [
        SchemaTable("scenario", "", "the sections of a replay scenario", config_schema(REPLAY_SCENARIO_SCHEMA)),
        SchemaTable("scenario", "plant", "the service model the capacity, batch cap and controllers are derived "
                    "from", config_schema(REPLAY_PLANT_SCHEMA)),
        *_shared_tables("scenario"),
        SchemaTable("scenario", "controller", "the admission controller", _controller_kind_rows()),
        _envelope_table("scenario"),
        SchemaTable("scenario", "simulation", "how the trace is replayed", config_schema(REPLAY_SIMULATION_SCHEMA)),
    ]


def _cluster_tables() -> list[SchemaTable]:
    """The simulated cluster: its fields, its pools' dynamics, its events and request classes."""
    from tokenfactory.core.classes import CLASS_SCHEMA
    from tokenfactory.core.events import EVENT_KINDS
    from tokenfactory.plant_models.des.config import EVENT_KINDS as CLUSTER_EVENTS, ClusterConfig
    from tokenfactory.plant_models.fleet import PoolDynamics

    return [
        SchemaTable("cluster", "cluster", "pools, delays, SLOs, prefix cache, KV watermark and run control",
                    config_schema(ClusterConfig)),
        SchemaTable("cluster", "cluster.dynamics", "how workers join and leave pools", config_schema(PoolDynamics)),
        *_event_tables("cluster", "[cluster.events]", {k: EVENT_KINDS[k] for k in CLUSTER_EVENTS}, "an event"),
        SchemaTable("cluster", "classes.NAME", "one request class (interactive and batch exist; a table for them "
                    "changes only the keys it gives)", config_schema(CLASS_SCHEMA)),
    ]


def _margins_tables() -> list[SchemaTable]:
    """A loop scenario (``margins``): its sections, fluid plant, controller, envelope, simulation, disturbances."""
    from tokenfactory.core.events import EVENT_KINDS
    from tokenfactory.plant_models.fluid import DISTURBANCE_KINDS, LOOP_SIMULATION_SCHEMA
    from tokenfactory.scenario import PLANT_SCHEMA, SCENARIO_SCHEMA

    return [
        SchemaTable("margins", "", "the sections of a loop scenario", config_schema(SCENARIO_SCHEMA)),
        SchemaTable("margins", "plant", "the fluid plant, sampled from the service model", config_schema(PLANT_SCHEMA)),
        *_shared_tables("margins"),
        SchemaTable("margins", "controller", "the admission controller (required)", _controller_kind_rows()),
        _envelope_table("margins"),
        SchemaTable("margins", "simulation", "the fluid simulation", config_schema(LOOP_SIMULATION_SCHEMA)),
        *_event_tables("margins", "[simulation.disturbances]", {k: EVENT_KINDS[k] for k in DISTURBANCE_KINDS},
                       "a disturbance"),
    ]


def _stack_tables() -> list[SchemaTable]:
    """A stack scenario's fixed tables (its layers' kinds follow, :func:`_stack_layer_tables`)."""
    from tokenfactory.plant_models.fleet import PoolDynamics
    from tokenfactory.stack.stack_scenario import (
        STACK_CERTIFICATE_SCHEMA,
        STACK_ENVELOPE_SCHEMA,
        STACK_PLANT_SCHEMA,
        STACK_SCENARIO_SCHEMA,
        STACK_SLO_SCHEMA,
        STACK_WORKLOAD_SCHEMA,
    )

    return [
        SchemaTable("stack", "", "the sections of a stack scenario", config_schema(STACK_SCENARIO_SCHEMA)),
        SchemaTable("stack", "plant", "as a loop scenario's plant, without pool sizes (the stack sizes them)",
                    config_schema(STACK_PLANT_SCHEMA)),
        *_shared_tables("stack"),
        SchemaTable("stack", "slo", "the promise the stack keeps", config_schema(STACK_SLO_SCHEMA)),
        SchemaTable("stack", "workload", "the nominal demand the stack is tuned for", config_schema(STACK_WORKLOAD_SCHEMA)),
        SchemaTable("stack", "dynamics", "how workers join and leave pools (as cluster.dynamics)",
                    config_schema(PoolDynamics)),
        SchemaTable("stack", "envelope", "the box every loop is certified over", config_schema(STACK_ENVELOPE_SCHEMA)),
        SchemaTable("stack", "certificate", "what the certificate demands of neighbouring loops",
                    config_schema(STACK_CERTIFICATE_SCHEMA)),
    ]


def _live_tables() -> list[SchemaTable]:
    """A live scenario's ``[live]`` table."""
    from tokenfactory.live.live_scenario import LIVE_SCHEMA

    return [SchemaTable("live", "live", "what the wire needs beside the scenario file's other tables (section scenario)",
                        config_schema(LIVE_SCHEMA))]


def _stack_layer_tables() -> list[SchemaTable]:
    """Each stack layer kind's table (``[layers.LAYER]`` with ``kind = ...``)."""
    from tokenfactory.registry.stack_layers import STACK_LAYER_KINDS

    tables = []
    for layer, kinds in STACK_LAYER_KINDS.items():
        for kind, cls in kinds.items():
            tables.append(SchemaTable("stack", f"layers.{layer}", _first_paragraph(cls.__doc__), config_schema(cls),
                                      f'kind = "{kind}"'))
    return tables


def _kind_tables() -> list[SchemaTable]:
    """Each registered admission and autoscaler kind's parameters, and the slo-aware kind's outer loop."""
    from tokenfactory.registry import ADMISSION_KINDS, AUTOSCALER_KINDS
    from tokenfactory.registry.kind_settings import KIND_SETTINGS, OUTER_LOOP_SCHEMA

    tables = []
    for layer, registered, prefix in (("admission", ADMISSION_KINDS, "admission"),
                                      ("reconfiguration", AUTOSCALER_KINDS, "autoscaler")):
        for name, k in registered.items():
            tables.append(SchemaTable("kinds", f"{prefix}.{name}", k.summary,
                                      config_schema(KIND_SETTINGS[layer].get(name, {}))))
    tables.append(SchemaTable("kinds", "admission.slo-aware.outer", "the slo-aware kind's slow loop on admitted "
                              "slack (its outer table)", config_schema(OUTER_LOOP_SCHEMA)))
    return tables


def _num(x: float) -> str:
    return f"{x:g}"


def allowed_text(row: dict[str, Any]) -> str:
    """The allowed values of a key in words: an interval, a list of choices, or ``-``.

    Parameters
    ----------
    row : dict
        A :func:`~tokenfactory.core.validation.config_schema` row.

    Returns
    -------
    str
    """
    parts = []
    if row["choices"]:
        parts.append("one of " + ", ".join(row["choices"]))
    if row["low"] is not None or row["high"] is not None:
        lo = "-inf" if row["low"] is None else _num(row["low"])
        hi = "inf" if row["high"] is None else _num(row["high"])
        lb = "[" if row["low"] is not None and row["low_inclusive"] else "("
        hb = "]" if row["high"] is not None and row["high_inclusive"] else ")"
        parts.append(f"{lb}{lo}, {hi}{hb}")
    if row["also"]:
        parts.append("or " + ", ".join(f'"{a}"' for a in row["also"]))
    return " ".join(parts) if parts else "-"


def default_text(row: dict[str, Any]) -> str:
    """The default of a key in words: ``required``, ``-`` (absent: see the meaning) or the value.

    Parameters
    ----------
    row : dict
        A :func:`~tokenfactory.core.validation.config_schema` row.

    Returns
    -------
    str
    """
    if row["required"]:
        return "required"
    v = row["default"]
    if v is None or (isinstance(v, (tuple, list)) and not v and "list" not in row["type"]):
        return "-"
    if dataclasses.is_dataclass(v):
        return "table"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return _num(v)
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_num(x) if isinstance(x, float) else str(x) for x in v) + "]"
    return str(v)


def _meaning(row: dict[str, Any]) -> str:
    return row["meaning"] + (f" (source: {row['source']})" if row["source"] else "")


def _markdown_cell(s: str) -> str:
    return s.replace("|", "\\|")


def render_schema(section: str | None = None, fmt: str = "text") -> str:
    """``describe schema`` output: every table of ``section`` (default all) as text, Markdown or JSON.

    Parameters
    ----------
    section : str, optional
        A key of :data:`SECTIONS`.
    fmt : {"text", "markdown", "json"}
        The format.

    Returns
    -------
    str
    """
    check_choice("format", fmt, ("text", "markdown", "json"))
    tables = schema_tables(section)
    if fmt == "json":
        return json.dumps([t.to_dict() for t in tables], indent=2, default=str)
    out: list[str] = []
    current = None
    for t in tables:
        if t.section != current:
            current = t.section
            if fmt == "markdown":
                out += [f"## {current}", "", SECTIONS[current][0].upper() + SECTIONS[current][1:] + ".", ""]
            else:
                out += [f"== {current}: {SECTIONS[current]}", ""]
        if fmt == "markdown":
            out += [f"### {current}: `{t.title}`", "", t.summary[0].upper() + t.summary[1:].rstrip(".") + ".", ""]
            if not t.rows:
                out += ["No parameters.", ""]
                continue
            out += ["| key | type | unit | default | allowed | meaning |", "|---|---|---|---|---|---|"]
            for r in t.rows:
                out.append("| " + " | ".join(_markdown_cell(c) for c in (
                    f"`{r['name']}`", r["type"], r["unit"] or "-", default_text(r), allowed_text(r), _meaning(r)))
                    + " |")
            out.append("")
        else:
            out += [f"{t.title}  -  {t.summary}"]
            if not t.rows:
                out += ["  (no parameters)", ""]
                continue
            width = max(len(r["name"]) for r in t.rows)
            for r in t.rows:
                unit = f" {r['unit']}" if r["unit"] else ""
                out.append(f"  {r['name']:<{width}}  {r['type']}{unit}; default {default_text(r)}; "
                           f"allowed {allowed_text(r)}")
                out.append(f"  {'':<{width}}  {_meaning(r)}")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def reference_page() -> str:
    """``docs/reference.md``: every section in Markdown under a short preface.

    Returns
    -------
    str
    """
    n = sum(len(t.rows) for t in schema_tables())
    head = ["# Reference: the files you write", "",
            "Generated by `python -m tokenfactory.reference --write docs/reference.md` (`make reference`) from "
            "the metadata each reader declares beside its code; `tests/test_reference.py` fails when this page "
            "differs from what the code generates, or when a reader accepts a key this page does not list. "
            f"{n} keys in {len(schema_tables())} tables. The same text, per section: "
            "`tokenfactory describe schema [SECTION] [--format text|markdown|json]`.", "",
            "Default `-`: the key may be left out, and the meaning says what is used then. Unknown keys are "
            "errors naming the allowed keys. A relative file path under `model`, `hardware` or `trace` is "
            "read beside the file that names it.", "", "Sections:", ""]
    head += [f"- [{s}](#{s}): {d}" for s, d in SECTIONS.items()]
    return "\n".join(head) + "\n\n" + render_schema(None, "markdown")


def main(argv: list[str] | None = None) -> int:
    """``python -m tokenfactory.reference [--write FILE | --check FILE]``: print, write or check the page.

    Parameters
    ----------
    argv : list of str, optional

    Returns
    -------
    int
        0, or 1 when ``--check`` finds the file out of date.
    """
    ap = argparse.ArgumentParser(prog="python -m tokenfactory.reference", description=__doc__.splitlines()[0])
    ap.add_argument("--write", type=Path, help="write the page to this file")
    ap.add_argument("--check", type=Path, help="exit 1 when this file differs from the generated page")
    args = ap.parse_args(argv)
    page = reference_page()
    if args.check is not None:
        ok = args.check.is_file() and args.check.read_text(encoding="utf-8") == page
        if not ok:
            print(f"{args.check} is out of date: run python -m tokenfactory.reference --write {args.check}",
                  file=sys.stderr)
        return 0 if ok else 1
    if args.write is not None:
        args.write.write_text(page, encoding="utf-8")
        print(f"wrote {args.write}")
        return 0
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
