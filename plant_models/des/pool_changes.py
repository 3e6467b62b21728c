"""Workers joining and leaving pools: autoscaling, reconfiguration moves, crashes, slowdowns.

Decisions follow the pool model's rules (:func:`tokenfactory.plant_models.fleet.scale_plan`,
:func:`~tokenfactory.plant_models.fleet.free_workers`): a scale-up requests workers that wait
for a free worker in a fixed fleet, then start up for ``startup_s`` (cancellable) and run at
``warmup_factor`` for ``warmup_s``; a scale-down withdraws unplaced requests, cancels starting
workers (newest first), then drains serving ones (newest first). Unlike the pool model, a
draining worker here finishes what it holds for real, and is billed until it has.

These are simpy processes: they run a few times per simulated minute, not per request.
"""

from __future__ import annotations

from tokenfactory.core.events import DecodeRateDip, LinkSlowdown, Reconfiguration, WorkerCrash
from tokenfactory.plant_models.des.aggregated import AggregatedWorker
from tokenfactory.plant_models.des.decode import DecodeWorker
from tokenfactory.plant_models.des.fill import FillWorker
from tokenfactory.plant_models.fleet import free_workers, scale_plan
from tokenfactory.core.signals import POOLS, sort_actions
from tokenfactory.core.validation import ConfigError

__all__ = ["StartTicket", "FleetControl"]


class StartTicket:
    """A requested worker: waiting for a free worker (fixed fleet), then starting up.

    Parameters
    ----------
    pool : str
        ``"fill"`` or ``"decode"``.
    """

    __slots__ = ("pool", "placed", "cancelled")

    def __init__(self, pool: str):
        self.pool = pool
        self.placed = False
        self.cancelled = False


class FleetControl:
    """Pools, autoscalers and events of :class:`tokenfactory.plant_models.des.simulator.Simulator`.

    Owns the start tickets (requested workers not yet serving) and the fleet-changed event. The
    worker lists are the stages' own (``core.fill.workers``, ``core.decode.workers``,
    ``core.aggregated.workers``); it dispatches a worker to its stage's ``next``, ``crash`` and
    idle queue, applies scale actions through :meth:`reconcile` and the controllers' other actions
    through ``core.monitor.apply_actions``.

    Interface: :meth:`pool`, :meth:`worker_next`, :meth:`unidle`, :meth:`speed`,
    :meth:`worker_finished`, :meth:`starting`, :meth:`in_use`, and the processes
    :meth:`autoscale` and :meth:`event_process` the run starts.

    Parameters
    ----------
    core : Simulator
        The simulator whose pools this controls.
    """

    def __init__(self, core):
        self.core = core
        self.env = core.env
        self.warmup_factor = core.cfg.dynamics.warmup_factor
        self.tickets: list = []
        self.fleet_changed = core.env.event()

    # -- workers --------------------------------------------------------------------------
    def pool(self, name: str) -> list:
        """The worker list of pool ``name`` (``"fill"`` or ``"decode"``)."""
        return self.core.fill.workers if name == "fill" else self.core.decode.workers

    def new_worker(self, pool: str):
        """A worker added to ``pool`` and started (the index is its position when added)."""
        workers = self.pool(pool)
        w = (FillWorker if pool == "fill" else DecodeWorker)(len(workers), self.env.event())
        workers.append(w)
        self.worker_next(w)
        return w

    def worker_next(self, w) -> None:
        """``w`` is free to take work: its stage's ``next``."""
        if isinstance(w, FillWorker):
            self.core.fill.next(w)
        elif isinstance(w, AggregatedWorker):
            self.core.aggregated.next(w)
        else:
            self.core.decode.next(w)

    def unidle(self, w) -> None:
        """Take ``w`` out of its idle queue (it crashed, drains or leaves)."""
        core = self.core
        (core.fill.idle if isinstance(w, FillWorker) else
         core.aggregated.idle if isinstance(w, AggregatedWorker) else core.decode.idle).discard(w)

    def speed(self, w) -> float:
        """A worker in its first ``warmup_s`` runs at ``warmup_factor`` of full speed."""
        return self.warmup_factor if self.env.now < w.warm_until else 1.0

    def start_draining(self, w) -> None:
        """``w`` takes nothing new and finishes what it holds."""
        w.draining = True
        if isinstance(w, DecodeWorker):
            w.listening = False
        if not w.holds_work():
            self.unidle(w)
            self.worker_finished(w)

    def worker_finished(self, w) -> None:
        """A draining worker holds nothing any more (or is gone)."""
        if not w.finished.triggered:
            w.finished.succeed()

    # -- autoscaling ----------------------------------------------------------------------
    def starting(self, pool: str) -> list:
        """Requested workers of ``pool`` not yet serving and not cancelled."""
        return [tk for tk in self.tickets if tk.pool == pool and not tk.cancelled]

    def in_use(self) -> int:
        """Workers holding a slot of a fixed fleet: in a pool (serving or draining) or starting."""
        return len(self.core.fill.workers) + len(self.core.decode.workers) + sum(
            1 for tk in self.tickets if tk.placed and not tk.cancelled)

    def autoscale(self, scaler):
        """An autoscaler's loop (also any other controller run beside admission, such as a
        decode batch gate: its batch caps and reservations are applied, admission commands are
        the admission controller's alone)."""
        env, cfg, monitor = self.env, self.core.cfg, self.core.monitor
        yield env.timeout(cfg.autoscale_start_s + cfg.snapshot_dt / 2)
        while True:
            acts = sort_actions(scaler.update(env.now, monitor.measure(env.now, scaler.sample_period)))
            others = [a for a in (acts.batch_cap, acts.reserve) if a is not None]
            if others:
                monitor.apply_actions(others, type(scaler).__name__)
            for a in acts.scales:
                if a.pool not in POOLS:
                    raise ConfigError(f"{type(scaler).__name__}.pool", f"{a.pool!r} is not one of {POOLS}")
                self.reconcile(a.pool, max(int(a.replicas), 0), type(scaler).__name__)
            yield env.timeout(scaler.sample_period)

    def reconcile(self, pool: str, target: int, who: str) -> None:
        """Deployment semantics (:func:`scale_plan`) toward ``target`` provisioned workers."""
        serving = [w for w in self.pool(pool) if not w.draining]
        starting = self.starting(pool)
        before = len(serving) + len(starting)
        if before == target:
            return
        waiting = [tk for tk in starting if not tk.placed]
        placed = [tk for tk in starting if tk.placed]
        plan = scale_plan(len(serving), len(placed), len(waiting), target)
        for _ in range(plan.request):
            tk = StartTicket(pool)
            self.tickets.append(tk)
            self.env.process(self.start_worker(tk))
        for tk in waiting[::-1][:plan.withdraw] + placed[::-1][:plan.cancel]:  # newest first
            tk.cancelled = True
        if plan.withdraw or plan.cancel:
            self.kick_fleet()
        for w in serving[::-1][:plan.drain]:
            self.env.process(self.retire(pool, w))
        self.core.actions.append({"time_s": self.env.now, "kind": "scale", "pool": pool, "from": before, "to": target,
                             "controller": who})

    def kick_fleet(self) -> None:
        ev = self.fleet_changed
        self.fleet_changed = self.env.event()
        ev.succeed()

    def start_worker(self, tk: StartTicket):
        env, dyn = self.env, self.core.cfg.dynamics
        # a fixed fleet: wait (as a pending pod, counted in transit) until a worker is free
        while not tk.cancelled and free_workers(dyn, self.in_use()) < 1:
            yield self.fleet_changed
        tk.placed = True
        if not tk.cancelled:
            yield env.timeout(dyn.startup_s)
        self.tickets.remove(tk)
        if tk.cancelled:
            self.kick_fleet()
            return
        w = self.new_worker(tk.pool)
        w.warm_until = env.now + dyn.warmup_s

    def retire(self, pool: str, w):
        self.start_draining(w)
        yield w.finished  # finishes its current work (billed until then), then leaves
        self.remove_worker(pool, w)

    def remove_worker(self, pool: str, w) -> None:
        w.retired = True
        self.unidle(w)
        if w in self.pool(pool):
            self.pool(pool).remove(w)
        self.kick_fleet()  # a worker of a fixed fleet is free for another role

    # -- events ---------------------------------------------------------------------------
    def event_process(self, e):
        env = self.env
        yield env.timeout(getattr(e, "at_s", getattr(e, "start_s", 0.0)))
        if isinstance(e, WorkerCrash):
            workers = self.pool(e.pool)
            if e.index >= len(workers) or not workers[e.index].online:
                return
            w = workers[e.index]
            w.online = False
            if e.pool == "decode":
                self.core.decode.crash(w)
            else:
                self.core.fill.crash(w)
            if w.draining:
                self.worker_finished(w)  # it holds nothing now
            yield env.timeout(e.restart_s)
            w.online = True
            if not w.retired:
                self.worker_next(w)
        elif isinstance(e, LinkSlowdown):
            fill = self.core.fill
            fill.link_factor *= e.factor
            yield env.timeout(e.duration_s)
            fill.link_factor /= e.factor
        elif isinstance(e, DecodeRateDip):
            decode = self.core.decode
            decode.set_rate_factor(decode.rate_factor * e.factor)
            yield env.timeout(e.duration_s)
            decode.set_rate_factor(decode.rate_factor / e.factor)
        elif isinstance(e, Reconfiguration):
            for _ in range(e.count):
                env.process(self.move_worker(e.source, e.target, e.downtime_s))

    def move_worker(self, source: str, target: str, downtime: float):
        """The newest online serving worker of ``source`` drains, is offline ``downtime``, then
        serves ``target``."""
        env = self.env
        active = [w for w in self.pool(source) if w.online and not w.draining]
        if not active:
            return
        w = active[-1]
        self.start_draining(w)
        yield w.finished
        self.remove_worker(source, w)
        yield env.timeout(downtime)
        self.new_worker(target)
        self.core.actions.append({"time_s": env.now, "kind": "reconfigured", "source": source, "target": target})
