"""Ray Serve ``autoscaling_config`` settings: read, write, build.

Fields, defaults and ranges from ``ray.serve.config.AutoscalingConfig`` (docs.ray.io, "Ray Serve
Autoscaling" and "Advanced Ray Serve Autoscaling"): ``min_replicas`` 1, ``max_replicas`` 1,
``initial_replicas``, ``target_ongoing_requests`` 2, ``metrics_interval_s`` 10, ``look_back_period_s``
30, ``smoothing_factor`` 1 (and its up/down variants), ``upscaling_factor`` / ``downscaling_factor``
(default: the smoothing factors), ``upscale_delay_s`` 30, ``downscale_delay_s`` 600,
``downscale_to_zero_delay_s``, ``aggregation_function`` ``mean``.

A file is either a Serve config (``applications[].deployments[].autoscaling_config``; the one
deployment that has an ``autoscaling_config``, or the one named) or a mapping whose key
``autoscaling_config`` holds the settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from tokenfactory.controllers.formats.common import NotModelled, Section, parse_name
from tokenfactory.core.errors import ConfigError
from tokenfactory.core.validation import check_choice, check_int, check_number

__all__ = ["RayServeSetting", "read_ray_serve"]


def _pos(f, v):
    return check_number(f, v, low=0.0, low_inclusive=False)


def _nonneg(f, v):
    return check_number(f, v, low=0.0)


#: AutoscalingConfig field -> parser (None-able fields default to None)
_FIELDS = {
    "min_replicas": lambda f, v: check_int(f, v, low=0),
    "initial_replicas": lambda f, v: check_int(f, v, low=0),
    "max_replicas": lambda f, v: check_int(f, v, low=1),
    "target_ongoing_requests": _pos,
    "metrics_interval_s": _pos,
    "look_back_period_s": _pos,
    "smoothing_factor": _pos,
    "upscale_smoothing_factor": _pos,
    "downscale_smoothing_factor": _pos,
    "upscaling_factor": _pos,
    "downscaling_factor": _pos,
    "downscale_delay_s": _nonneg,
    "downscale_to_zero_delay_s": _nonneg,
    "upscale_delay_s": _nonneg,
    "aggregation_function": lambda f, v: check_choice(f, v, ("mean", "max", "min")),
}


@dataclass(frozen=True)
class RayServeSetting:
    """One deployment's ``autoscaling_config``, as read, with Ray's defaults filled in.

    Parameters
    ----------
    application : str, optional
        ``applications[].name`` of the Serve config (None: unnamed, or a bare ``autoscaling_config``).
    deployment : str, optional
        ``deployments[].name`` (None: a bare ``autoscaling_config`` mapping).
    min_replicas : int
        Lower bound (>= 0; default 1).
    initial_replicas : int, optional
        Replicas at start (>= 0; default None: Ray starts at ``min_replicas``).
    max_replicas : int
        Upper bound (>= max(1, min_replicas); default 1).
    target_ongoing_requests : float
        Ongoing requests (running plus queued) per replica the policy aims for (> 0; default 2).
    metrics_interval_s : float
        How often each replica reports its ongoing requests (s, > 0; default 10).
    look_back_period_s : float
        Window the controller averages the reports over (s, > 0; default 30).
    smoothing_factor : float
        Multiplier of each change in both directions (> 0; default 1).
    upscale_smoothing_factor, downscale_smoothing_factor : float, optional
        Per-direction smoothing factors (> 0; default None: ``smoothing_factor``).
    upscaling_factor, downscaling_factor : float, optional
        Per-direction multipliers of each change (> 0; default None: the direction's smoothing
        factor, see :meth:`factors`).
    downscale_delay_s : float
        How long consecutive scale-down decisions must last before one applies (s, >= 0; default 600).
    downscale_to_zero_delay_s : float, optional
        The same for the last step, 1 -> 0 (s, >= 0; default None: ``downscale_delay_s``).
    upscale_delay_s : float
        How long consecutive scale-up decisions must last before one applies (s, >= 0; default 30).
    aggregation_function : str
        How the look-back window is aggregated: ``"mean"`` (default; the one modelled), ``"max"`` or ``"min"``.
    """

    application: str | None = None
    deployment: str | None = None
    min_replicas: int = 1
    initial_replicas: int | None = None
    max_replicas: int = 1
    target_ongoing_requests: float = 2.0
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    smoothing_factor: float = 1.0
    upscale_smoothing_factor: float | None = None
    downscale_smoothing_factor: float | None = None
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    upscale_delay_s: float = 30.0
    aggregation_function: str = "mean"
    format: str = field(default="ray-serve", init=False)

    def config(self) -> dict:
        """The ``autoscaling_config`` mapping (fields left at None omitted)."""
        return {k: getattr(self, k) for k in _FIELDS if getattr(self, k) is not None}

    def to_documents(self) -> list[dict]:
        if self.deployment is None:
            return [{"autoscaling_config": self.config()}]
        app: dict[str, Any] = {"deployments": [{"name": self.deployment, "autoscaling_config": self.config()}]}
        if self.application is not None:
            app = {"name": self.application, **app}
        return [{"applications": [app]}]

    def factors(self) -> tuple[float, float]:
        """(upscaling, downscaling) factor as Ray resolves them: the factor, else the direction's
        smoothing factor, else ``smoothing_factor``."""
        up = self.upscaling_factor or self.upscale_smoothing_factor or self.smoothing_factor
        down = self.downscaling_factor or self.downscale_smoothing_factor or self.smoothing_factor
        return up, down

    def controller_params(self) -> dict:
        """Keyword arguments of :class:`tokenfactory.controllers.ray_serve_autoscaler.RayServeAutoscaler`."""
        if self.aggregation_function != "mean":
            raise NotModelled("autoscaling_config.aggregation_function", f"{self.aggregation_function!r}; the model "
                              "averages the look-back window")
        up, down = self.factors()
        return {"target_ongoing_requests": self.target_ongoing_requests, "metric": "decode_concurrency",
                "min_replicas": max(1, self.min_replicas), "max_replicas": self.max_replicas,
                "upscale_delay_s": self.upscale_delay_s, "downscale_delay_s": self.downscale_delay_s,
                "downscale_to_zero_delay_s": self.downscale_to_zero_delay_s,
                "upscaling_factor": up, "downscaling_factor": down, "metrics_interval_s": self.metrics_interval_s,
                "look_back_period_s": self.look_back_period_s}

    def build(self, pool: str):
        from tokenfactory.controllers.ray_serve_autoscaler import RayServeAutoscaler

        params = self.controller_params()
        if pool == "fill":
            params["metric"] = "fill_concurrency"
        return RayServeAutoscaler(pool, **params)

    def with_params(self, **changes) -> RayServeSetting:
        """Knobs by the model's names (the ``autoscaling_config`` field names; ``target`` is
        ``target_ongoing_requests``)."""
        names = {f.name for f in fields(self)} - {"application", "deployment", "format"}
        out = {}
        for key, value in changes.items():
            key = "target_ongoing_requests" if key == "target" else key
            if key not in names:
                raise ConfigError(f"ray_serve.{key}", "not a knob of this setting; knobs: " + ", ".join(sorted(names)))
            out[key] = value
        return replace(self, **out)


def _read_config(sec: Section, application: str | None, deployment: str | None) -> RayServeSetting:
    values = {}
    for key in list(sec.mapping):
        if key in _FIELDS:
            values[key] = sec.get(key, parse=_FIELDS[key])
        elif key == "policy":
            raise NotModelled(sec.path(key), "custom autoscaling policies")
    sec.close()
    setting = RayServeSetting(application=application, deployment=deployment, **values)
    if setting.max_replicas < max(1, setting.min_replicas):
        raise ConfigError(sec.path("max_replicas"), f"{setting.max_replicas} is below min_replicas "
                          f"{setting.min_replicas}")
    return setting


def read_ray_serve(docs: list[dict], where: str = "ray_serve", deployment: str | None = None) -> RayServeSetting:
    """The :class:`RayServeSetting` of a Serve config or an ``autoscaling_config`` mapping.

    Parameters
    ----------
    docs : list of dict
        The file's parsed YAML documents: exactly one, a Serve config (``applications``) or a
        mapping with the key ``autoscaling_config``.
    where : str
        Name of the file, the root of every error's path (default ``"ray_serve"``).
    deployment : str, optional
        The deployment to read in a Serve config (default None: the one deployment that has an
        ``autoscaling_config``).

    Raises
    ------
    ConfigError
        When not exactly one deployment matches, for a value out of range or an unknown field;
        :class:`NotModelled` for a custom ``policy``.
    """
    if len(docs) != 1:
        raise ConfigError(where, f"expected one YAML document, found {len(docs)}")
    top = Section(docs[0], where)
    if "autoscaling_config" in top:
        setting = _read_config(top.section("autoscaling_config"), None, None)
        top.close()
        return setting
    top.ignore("proxy_location", "http_options", "grpc_options", "logging_config")
    found: list[tuple[Section, str | None, str]] = []
    for app in top.sections("applications"):
        app_name = app.get("name", None)
        app.ignore("route_prefix", "import_path", "runtime_env", "args", "external_scaler_enabled")
        for dep in app.sections("deployments"):
            dep_name = dep.get("name", parse=parse_name)
            if "autoscaling_config" in dep and (deployment is None or dep_name == deployment):
                found.append((dep.section("autoscaling_config"), app_name, dep_name))
            dep.ignore(*dep.mapping)   # replicas, actor options, user config: the deployment, not the autoscaler
        app.close()
    top.close()
    if len(found) != 1:
        names = [d for _, _, d in found]
        raise ConfigError(f"{where}.applications", f"expected one deployment with an autoscaling_config"
                          + (f" named {deployment!r}" if deployment else "") + f"; found {names or 'none'}")
    sec, app_name, dep_name = found[0]
    return _read_config(sec, app_name, dep_name)
