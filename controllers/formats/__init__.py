"""Control-plane settings in their own formats: read them, build the matching controller, write
them back with only the knobs changed.

Each format is a module with a frozen setting dataclass (every field of the file that the
model uses, defaults filled in) that knows ``to_documents()`` (YAML-ready mappings that read back
to an equal setting), ``controller_params()`` / ``build(pool)`` (the tokenfactory control plane
with exactly those parameters; :class:`NotModelled` names a valid field the model cannot honour)
and ``with_params(**knobs)`` (the same setting with knobs changed by the model's names):

========================  =========================================  ==============================
format                    file                                       controller
========================  =========================================  ==============================
``kubernetes-hpa``        HorizontalPodAutoscaler autoscaling/v2      ``HorizontalPodAutoscaler``
                          (+ KubeControllerManagerConfiguration)
``keda``                  ScaledObject keda.sh/v1alpha1               the HPA KEDA creates
``knative``               Service annotations (+ config-autoscaler)  ``KnativeAutoscaler``
``ray-serve``             Serve config / ``autoscaling_config``       ``RayServeAutoscaler``
``aibrix``                PodAutoscaler autoscaling.aibrix.ai         ``AIBrixAPA`` / KPA / HPA
``vllm``                  ``vllm serve --config`` engine arguments    the decode batch cap
``dynamo-planner``        Dynamo ``PlannerConfig`` (``--config``)     ``DynamoPlanner`` (ai-dynamo)
========================  =========================================  ==============================

:func:`read_control_plane` sniffs the format from the documents' ``kind``; every unknown field is
a :class:`~tokenfactory.core.errors.ConfigError` naming its path. :func:`dump_control_plane` writes a
setting; :func:`rewrite_control_plane` edits the user's own file (comments and unrelated fields
kept), changing only the values that differ, each with an end-of-line comment.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenfactory.controllers.formats.aibrix import AIBrixSetting, read_aibrix
from tokenfactory.controllers.formats.common import ENGINE_METRICS, NotModelled
from tokenfactory.controllers.formats.dynamo_planner_config import (
    DynamoPlannerSetting,
    looks_like_planner_config,
    read_dynamo_planner,
)
from tokenfactory.controllers.formats.keda import KEDASetting, read_keda
from tokenfactory.controllers.formats.knative import KnativeSetting, read_knative
from tokenfactory.controllers.formats.kubernetes_hpa import CONTROLLER_MANAGER_KIND, HPASetting, read_hpa
from tokenfactory.controllers.formats.ray_serve import RayServeSetting, read_ray_serve
from tokenfactory.controllers.formats.vllm import CONTROL_KEYS as VLLM_KEYS
from tokenfactory.controllers.formats.vllm import VLLMSetting, read_vllm
from tokenfactory.core.errors import ConfigError

__all__ = ["read_control_plane", "parse_control_plane", "dump_control_plane", "rewrite_control_plane", "FORMATS",
           "NotModelled", "ENGINE_METRICS", "HPASetting", "KEDASetting", "KnativeSetting", "RayServeSetting",
           "AIBrixSetting", "VLLMSetting", "DynamoPlannerSetting", "ControlPlaneSetting"]

ControlPlaneSetting = (HPASetting | KEDASetting | KnativeSetting | RayServeSetting | AIBrixSetting | VLLMSetting
                       | DynamoPlannerSetting)

#: format name -> reader of the parsed documents
FORMATS: dict[str, Callable[..., Any]] = {
    "kubernetes-hpa": read_hpa,
    "keda": read_keda,
    "knative": read_knative,
    "ray-serve": read_ray_serve,
    "aibrix": read_aibrix,
    "vllm": read_vllm,
    "dynamo-planner": read_dynamo_planner,
}
_BY_KIND = {"HorizontalPodAutoscaler": "kubernetes-hpa", CONTROLLER_MANAGER_KIND: "kubernetes-hpa",
            "ScaledObject": "keda", "Service": "knative", "ConfigMap": "knative", "PodAutoscaler": "aibrix"}


def _load_documents(text: str, where: str) -> list[dict]:
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(where, f"not valid YAML: {exc}") from None
    if not docs or not all(isinstance(d, dict) for d in docs):
        raise ConfigError(where, "expected one or more YAML mappings")
    return docs


def sniff_format(docs: list[dict], where: str = "control_plane") -> str:
    """The format of parsed documents: by ``kind`` for Kubernetes objects, ``ray-serve`` for a
    Serve config or an ``autoscaling_config`` mapping, ``dynamo-planner`` for a mapping of
    Dynamo PlannerConfig fields."""
    kinds = {d.get("kind") for d in docs}
    if kinds == {None} and len(docs) == 1 and looks_like_planner_config(docs[0]):
        return "dynamo-planner"
    if kinds == {None} and len(docs) == 1 and ("applications" in docs[0] or "autoscaling_config" in docs[0]):
        return "ray-serve"
    if kinds == {None} and len(docs) == 1 and ("model" in docs[0] or any(
            str(k).replace("_", "-") in VLLM_KEYS for k in docs[0])):
        return "vllm"
    formats = {_BY_KIND.get(k) for k in kinds}
    if len(formats) != 1 or None in formats:
        raise ConfigError(where, f"cannot tell the control plane from kinds {sorted(map(str, kinds))}; supported: "
                          "HorizontalPodAutoscaler (autoscaling/v2), ScaledObject (KEDA), Knative Service, "
                          "PodAutoscaler (AIBrix), a Ray Serve config, a vLLM config, a Dynamo planner "
                          "config")
    return formats.pop()


def parse_control_plane(text: str, *, fmt: str | None = None, where: str = "control_plane",
                        **options) -> ControlPlaneSetting:
    """The setting of a YAML text (``fmt`` sniffed when None; ``options`` go to the reader, e.g.
    ``deployment=`` for a Ray Serve config).

    Parameters
    ----------
    text : str
        The file's YAML, one or more documents.
    fmt : str, optional
        A key of :data:`FORMATS` (``"kubernetes-hpa"``, ``"keda"``, ...); default None: sniffed from
        the documents (:func:`sniff_format`).
    where : str
        Name of the file, the root of every error's path (default ``"control_plane"``).

    Raises
    ------
    ConfigError
        For invalid YAML, an unknown or unrecognisable format, or any error of the format's reader.
    """
    docs = _load_documents(text, where)
    fmt = fmt or sniff_format(docs, where)
    if fmt not in FORMATS:
        raise ConfigError("format", f"{fmt!r} is not one of {', '.join(FORMATS)}")
    return FORMATS[fmt](docs, where, **options)


def read_control_plane(path, **options) -> ControlPlaneSetting:
    """The setting in the file ``path`` (see :func:`parse_control_plane`).

    Parameters
    ----------
    path : str or Path
        The settings file; its name is the root of every error's path.

    Raises
    ------
    ConfigError
        When the file does not exist, or as :func:`parse_control_plane`.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError("control_plane", f"file {str(path)!r} does not exist")
    return parse_control_plane(path.read_text(), where=path.name, **options)


def dump_control_plane(setting: ControlPlaneSetting) -> str:
    """The setting as YAML (all fields explicit); :func:`parse_control_plane` reads it back equal.

    Parameters
    ----------
    setting : ControlPlaneSetting
        A setting of any format (its ``to_documents()`` are written, one YAML document each).
    """
    import yaml

    return yaml.safe_dump_all(setting.to_documents(), sort_keys=False, default_flow_style=False)


# ---- editing the user's own file ------------------------------------------------------------

def _named(items) -> bool:
    return all(isinstance(x, dict) and "name" in x for x in items)


def _diff(old: Any, new: Any, path: tuple) -> list[tuple[tuple, Any, Any]]:
    """(path, old, new) of every leaf that differs; lists of named mappings match by name, other
    lists change whole."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in new:
            out += _diff(old.get(key, _ABSENT), new[key], path + (key,)) if key in old else [(path + (key,), _ABSENT,
                                                                                              new[key])]
        return out
    if isinstance(old, list) and isinstance(new, list) and old and new and _named(old) and _named(new):
        by_name = {x["name"]: x for x in old}
        out = []
        for item in new:
            step = ("name=" + str(item["name"]),)
            out += _diff(by_name[item["name"]], item, path + step) if item["name"] in by_name else \
                [(path + step, _ABSENT, item)]
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) == 1 and isinstance(old[0], dict) \
            and isinstance(new[0], dict):
        return _diff(old[0], new[0], path + (0,))
    return [] if old == new else [(path, old, new)]


_ABSENT = object()


def _plain(x):
    """ruamel's commented containers as plain dicts and lists (for comparison)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x


def _indentation(text: str) -> dict:
    """ruamel's indent settings that reproduce the file's own: the mapping indent and where a
    list's dashes sit under their key (``metrics:`` then ``- type`` at +0 or +2 columns)."""
    import re

    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    mapping, offset = 2, 0
    for a, b in zip(lines, lines[1:]):
        ia, ib = len(a) - len(a.lstrip()), len(b) - len(b.lstrip())
        if re.fullmatch(r"\s*[^\s-][^:]*:\s*", a):
            if b.lstrip().startswith("- "):
                offset = ib - ia
                break
            if ib > ia:
                mapping = ib - ia
    return {"mapping": mapping, "sequence": mapping + offset, "offset": offset}


def _doc_key(doc: dict) -> Any:
    return doc.get("kind") or "serve"


def rewrite_control_plane(text: str, new: ControlPlaneSetting, *,
                          comment: Callable[[str, Any, Any], str] | None = None, **options) -> str:
    """The user's YAML ``text`` with only the values that differ between its setting and ``new``
    changed (comments, key order and unrelated fields kept); each changed line carries
    ``comment(path, old, new)`` as an end-of-line comment.

    Parameters
    ----------
    text : str
        The user's YAML file, as read.
    new : ControlPlaneSetting
        The setting to write, of the same format as ``text``.
    comment : callable, optional
        ``comment(path, old, new) -> str``: the end-of-line comment of a changed value, given its
        dotted path and its old (None where it was absent) and new value; default None: no comments.

    Raises
    ------
    ConfigError
        When ``text`` does not read as the same format as ``new``.
    """
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    old = parse_control_plane(text, fmt=new.format, **options)
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.indent(**_indentation(text))
    docs = list(yaml.load_all(text))
    new_docs = new.to_documents()
    old_docs = old.to_documents()
    for nd in new_docs:
        od = next((d for d in old_docs if _doc_key(d) == _doc_key(nd)), {})
        target = next((d for d in docs if isinstance(d, dict) and _doc_key(d) == _doc_key(nd)), None)
        if target is None:
            docs.append(nd)
            continue
        for path, before, after in _diff(od, nd, ()):
            node = target
            for step in path[:-1]:
                if isinstance(step, str) and step.startswith("name=") and isinstance(node, list):
                    node = next(x for x in node if str(x.get("name")) == step[5:])
                    continue
                if isinstance(step, int):
                    node = node[step]
                    continue
                if step not in node or node[step] is None:
                    node[step] = CommentedMap()
                node = node[step]
            last = path[-1]
            alias = getattr(new, "field_aliases", {}).get(last)
            if alias is not None and last not in node and alias in node:
                last = alias   # the file spells the field by an alias its format accepts: edit it there
            if isinstance(last, str) and last.startswith("name=") and isinstance(node, list):
                node.append(after)
                continue
            if isinstance(node.get(last), str) and not isinstance(after, str):
                after = str(after)
            node[last] = after
            if comment is not None and isinstance(node, (CommentedMap, CommentedSeq)):
                node.yaml_add_eol_comment(comment(".".join(map(str, path)), None if before is _ABSENT else before,
                                                  after), last)
    out = io.StringIO()
    yaml.dump_all(docs, out)
    return out.getvalue()
