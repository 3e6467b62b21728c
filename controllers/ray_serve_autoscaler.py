"""Ray Serve's default autoscaling policy as a pool controller.

The decision follows ``ray/serve/autoscaling_policy.py`` (``replica_queue_length_autoscaling_policy``
and the default-parameter wrapper, Ray 2.5x):

* the metric is the total number of ongoing requests (running plus queued) over the running
  replicas, each replica reporting every ``metrics_interval_s`` and the controller averaging the
  reports of the last ``look_back_period_s``;
* desired = running x total / (target_ongoing_requests x running) = total / target;
* scaling factor: ``ceil(current + factor x (desired - current))`` with the upscaling (downscaling)
  factor, falling back to the smoothing factors and then 1; a downscale stuck by the factor moves
  by one;
* bounds, then the delay logic against the current *target* replica count: a scale-up (down)
  decision must repeat for ``upscale_delay_s`` (``downscale_delay_s``) of consecutive control
  loops before the target moves; an opposite or neutral decision resets the counter.

Ray's control loop runs every 0.1 s (``CONTROL_LOOP_INTERVAL_S``); here it runs every
``sample_period`` seconds and the delays count seconds the same way
(``int(delay / sample_period)`` consecutive loops), so the timing is Ray's to within one sample.
"""

from __future__ import annotations

import math
from collections import deque

from tokenfactory.controllers.autoscaling import POOL_METRICS
from tokenfactory.controllers.interface import SampledController
from tokenfactory.core.signals import Measurement, ScaleAction
from tokenfactory.core.validation import check_choice, check_int, check_number

__all__ = ["RayServeAutoscaler"]


class RayServeAutoscaler(SampledController):
    """Ray Serve's queue-length autoscaler on one pool.

    Parameters
    ----------
    pool : str
        ``"fill"`` or ``"decode"``.
    target_ongoing_requests : float
        Ongoing requests per replica the policy aims for (> 0; Ray's default 2).
    metric : str
        A :data:`POOL_METRICS` key giving the pool's total ongoing requests (default
        ``"decode_concurrency"``: sequences decoding plus waiting for a slot).
    min_replicas, max_replicas : int
        Bounds (Ray's defaults 1 and 1; max >= max(1, min)).
    upscale_delay_s, downscale_delay_s : float
        Consecutive-decision delays (s, >= 0; Ray's defaults 30 and 600).
    downscale_to_zero_delay_s : float, optional
        The delay of the last step, 1 -> 0 (s, >= 0; default: ``downscale_delay_s``).
    upscaling_factor, downscaling_factor : float
        Multipliers of each change (> 0; Ray's default 1).
    metrics_interval_s, look_back_period_s : float
        Report period and averaging window of the metric (s, > 0; Ray's defaults 10 and 30).
    sample_period : float
        Control-loop period (s, > 0; default 1; Ray's 0.1).
    """

    name = "ray-serve"

    def __init__(self, pool: str, target_ongoing_requests: float = 2.0, metric: str = "decode_concurrency", *,
                 min_replicas: int = 1, max_replicas: int = 1, upscale_delay_s: float = 30.0,
                 downscale_delay_s: float = 600.0, downscale_to_zero_delay_s: float | None = None,
                 upscaling_factor: float = 1.0, downscaling_factor: float = 1.0, metrics_interval_s: float = 10.0,
                 look_back_period_s: float = 30.0, sample_period: float = 1.0):
        super().__init__(sample_period)
        self.pool = check_choice("ray_serve.pool", pool, ("fill", "decode"))
        self.target_ongoing_requests = check_number("ray_serve.target_ongoing_requests", target_ongoing_requests,
                                                    low=0.0, low_inclusive=False)
        self.metric = check_choice("ray_serve.metric", metric, POOL_METRICS)
        self.min_replicas = check_int("ray_serve.min_replicas", min_replicas, low=0)
        self.max_replicas = check_int("ray_serve.max_replicas", max_replicas, low=max(1, self.min_replicas))
        self.upscale_delay_s = check_number("ray_serve.upscale_delay_s", upscale_delay_s, low=0.0)
        self.downscale_delay_s = check_number("ray_serve.downscale_delay_s", downscale_delay_s, low=0.0)
        self.downscale_to_zero_delay_s = (None if downscale_to_zero_delay_s is None else check_number(
            "ray_serve.downscale_to_zero_delay_s", downscale_to_zero_delay_s, low=0.0))
        self.upscaling_factor = check_number("ray_serve.upscaling_factor", upscaling_factor, low=0.0,
                                             low_inclusive=False)
        self.downscaling_factor = check_number("ray_serve.downscaling_factor", downscaling_factor, low=0.0,
                                               low_inclusive=False)
        self.metrics_interval_s = check_number("ray_serve.metrics_interval_s", metrics_interval_s, low=0.0,
                                               low_inclusive=False)
        self.look_back_period_s = check_number("ray_serve.look_back_period_s", look_back_period_s, low=0.0,
                                               low_inclusive=False)
        self.reset()

    def reset(self) -> None:
        self._reports: deque = deque()     # (t, total ongoing requests) every metrics_interval_s
        self._next_report = -math.inf
        self._counter = 0
        self._target: int | None = None

    def average_requests(self, t: float, value: float) -> float:
        """The look-back average of the pool's ongoing requests, ``value`` being reported at
        ``t`` when a metrics interval has passed since the last report."""
        if t >= self._next_report:
            self._reports.append((t, value))
            self._next_report = t + self.metrics_interval_s
        while self._reports and self._reports[0][0] < t - self.look_back_period_s:
            self._reports.popleft()
        return sum(v for _, v in self._reports) / len(self._reports)

    def recommend(self, running: int, total_requests: float, target: int | None = None) -> int:
        """One control loop of Ray's policy: the deployment's new target replica count.

        Parameters
        ----------
        running : int
            Running replicas (``current_num_replicas`` in Ray).
        total_requests : float
            Ongoing requests over the deployment, already aggregated (``total_num_requests``).
        target : int, optional
            The deployment's current target (``target_num_replicas``; default: this
            controller's last decision, or ``running`` at the first call).
        """
        if target is None:
            target = self._target if self._target is not None else running
        if running == 0:   # Ray's cold-start path: straight up on traffic, no delay
            self._target = max(math.ceil(self.upscaling_factor), target) if total_requests > 0 else target
            return self._target
        desired = total_requests / self.target_ongoing_requests
        delta = desired - running
        scaled = math.ceil(running + (self.upscaling_factor if delta > 0 else self.downscaling_factor) * delta)
        if math.ceil(desired) < running and scaled == running:   # a downscale stuck by the factor moves by one
            scaled -= 1
        bounded = max(self.min_replicas, min(self.max_replicas, scaled))
        decision = target
        if bounded > target:
            self._counter = max(self._counter, 0) + 1
            if self._counter > int(self.upscale_delay_s / self.sample_period):
                self._counter, decision = 0, bounded
        elif bounded < target:
            self._counter = min(self._counter, 0) - 1
            to_zero = target == 1   # only 1 -> 0 may reach zero
            delay = (self.downscale_to_zero_delay_s if to_zero and self.downscale_to_zero_delay_s is not None
                     else self.downscale_delay_s)
            if self._counter < -int(delay / self.sample_period):
                self._counter, decision = 0, bounded if to_zero else max(1, bounded)
        else:
            self._counter = 0
        self._target = decision
        return decision

    def update(self, t: float, m: Measurement) -> ScaleAction:
        running = int(round(m.decode_workers if self.pool == "decode" else m.fill_workers))
        return ScaleAction(self.pool, self.recommend(running, self.average_requests(t, POOL_METRICS[self.metric](m))))

    def params(self) -> dict:
        return {k: getattr(self, k) for k in ("pool", "target_ongoing_requests", "metric", "min_replicas",
                                              "max_replicas", "upscale_delay_s", "downscale_delay_s",
                                              "downscale_to_zero_delay_s", "upscaling_factor", "downscaling_factor", "metrics_interval_s",
                                              "look_back_period_s", "sample_period")}
