"""Measurement and control: the recorded time series, what controllers see, when they act.

Every ``snapshot_dt`` the simulator records a :class:`~tokenfactory.plant_models.des.records.Snapshot`
(a scheduled call; through a stretch in which no event is pending the row is held by one table
write instead of one call per sample, which is what makes sparse long runs cheap).
A controller sampled at t sees the row of t - ``measurement_delay_s`` (rates averaged over its
sample period, as a scrape of counters gives) as a :class:`tokenfactory.core.signals.Measurement`;
its admission action holds until its next sample. Pool autoscalers see the same measurements
(:mod:`tokenfactory.plant_models.des.pool_changes`).
"""

from __future__ import annotations

import math
import sys
import time

from tokenfactory.plant_models.des.records import ClassSnapshotTable, Snapshot, SnapshotTable
from tokenfactory.core.signals import ClassLoad, Measurement, sort_actions

__all__ = ["Monitor"]


class Monitor:
    """Snapshots, measurements and the admission control loop of
    :class:`tokenfactory.plant_models.des.simulator.Simulator`.

    Owns the recorded time series (``snap``, ``class_snap``). It reads the flow counters and
    queues through ``core`` and the stages' workers, batch cap and token rates; it applies a
    controller's actions to their owners (the admission command to ``core``, the batch cap to
    ``core.decode``, the fill reservation to ``core.fill``).

    Interface: :meth:`start_snapshots`, :meth:`measure` (what a controller sees),
    :meth:`apply_actions`, and the processes :meth:`control` and :meth:`progress`.

    Parameters
    ----------
    core : Simulator
        The simulator this records.
    """

    def __init__(self, core):
        self.core = core
        self.snap = self.class_snap = None

    def start_snapshots(self, duration: float) -> None:
        """Allocate the time series and record its first row now."""
        core = self.core
        dt = core.cfg.snapshot_dt
        rows = math.ceil(duration / dt - 1e-9)
        self.snap = SnapshotTable(rows, dt)
        self.class_snap = ClassSnapshotTable(rows, core.class_names)
        self._snap_k = 0
        core.call_in(0.0, self.snapshot)

    def snapshot(self) -> None:
        """Record row k (at k x snapshot_dt), hold it through the quiet stretch before the next
        event, and come back at the first sample time after that event."""
        core = self.core
        env, dt, table = core.env, core.cfg.snapshot_dt, self.snap
        k = self._snap_k
        stage = core.decode
        decode, fill, aggregated = stage.workers, core.fill.workers, core.aggregated.workers
        speed = core.fleet.speed
        n_dec = dec_serving = n_fill = fill_serving = 0
        held = 0.0
        pass_sum, busy = 0.0, 0
        p = core.p
        for w in decode:
            n_dec += w.online
            dec_serving += not w.draining
            B = len(w.members)
            ctx = w.offset_sum + B * w.n
            held += ctx
            if B and w.online:  # the pass time its sequences see now
                pass_sum += p.decode_pass(B, ctx / B)[0] / (stage.rate_factor * speed(w))
                busy += 1
        for w in fill:
            n_fill += w.online
            fill_serving += not w.draining
        n_agg = len(aggregated)
        for w in aggregated:  # serving both roles
            held += w.offset_sum + len(w.members) * w.n
        n_dec += n_agg
        dec_serving += n_agg
        n_fill += n_agg
        fill_serving += n_agg
        starting = {"fill": 0, "decode": 0}
        placed = {"fill": 0, "decode": 0}
        for tk in core.fleet.tickets:
            if not tk.cancelled:
                starting[tk.pool] += 1
                placed[tk.pool] += tk.placed
        # slots as an orchestrator would estimate them: KV capacity / the KV of a sequence at the
        # mean context of those decoding now (the nominal context when nothing decodes)
        decoding = core.decoding
        ctx_mean = held / decoding if decoding > 0 else core.nominal_ctx
        per_seq = p.kv_bytes(ctx_mean)
        kv_slots = stage.kv_limit / per_seq if per_seq > 0 else math.inf
        fill_tokens = float(sum(core.tok_fill))
        token_cap = n_fill * core.fill_token_rate
        table.write(k, Snapshot(
            time_s=k * dt, backlog=len(core.backlog), fill_in_progress=core.fill_wip + core.fill.in_transfer,
            ready=len(core.ready), active_decodes=decoding,
            decode_slots=n_dec * min(kv_slots, stage.batch_cap),
            fill_capacity=n_fill * core.nominal_fill_rps, fill_workers=fill_serving, decode_workers=dec_serving,
            arrival_rate=core.arrived_since / dt, admission_rate=core.action.rate,
            admitted_rate=core.admitted_since / dt, completion_rate=core.completed_since / dt,
            arrived=core.arrived, completed=core.completed, rejected=core.rejected,
            fill_workers_starting=starting["fill"], decode_workers_starting=starting["decode"],
            fill_workers_billed=len(fill) + placed["fill"], decode_workers_billed=len(decode) + placed["decode"],
            fill_queued_tokens=fill_tokens, fill_token_capacity=token_cap,
            decode_pass_s=pass_sum / busy if busy else math.nan,
            decode_context_tokens=held / decoding if decoding > 0 else math.nan,
            decode_batch_cap=stage.batch_cap, deferred=sum(core.c_deferred), aggregated_workers=n_agg))
        # per class: a new arrival waits for the tokens of its own and higher-priority levels
        lvl, tok = core.class_level, core.tok_fill
        rows = []
        for c in range(len(core.class_names)):
            ahead = sum(tok[j] for j in range(len(tok)) if lvl[j] <= lvl[c])
            rows.append((core.c_backlog[c], core.c_deferred[c], core.c_fip[c], tok[c], core.c_ready[c],
                         core.c_dec[c], core.c_arr_since[c] / dt, ahead / token_cap if token_cap > 0 else math.inf))
            core.c_arr_since[c] = 0
        self.class_snap.write(k, rows)
        core.completed_since = core.admitted_since = core.arrived_since = 0
        # nothing changes before the next pending event (the run's end at the latest)
        last = len(table.data) - 1
        nxt = max(k + 1, math.ceil(env.peek() / dt - 1e-9))
        table.hold(k, min(nxt - 1, last))
        self.class_snap.hold(k, min(nxt - 1, last))
        if nxt <= last:
            self._snap_k = nxt
            core.call_in(nxt * dt - env.now, self.snapshot)

    def measure(self, t: float, period: float) -> Measurement:
        """What a controller sampling every ``period`` sees at ``t``: the row of t minus the
        measurement delay, its rates averaged over the sample period, per class as well."""
        cfg, table = self.core.cfg, self.snap
        dt = cfg.snapshot_dt
        k = min(max(int(round((t - cfg.measurement_delay_s) / dt)), 0), len(table) - 1)
        row = table.row(k)
        lo = max(0, k - max(1, int(round(period / dt))) + 1)
        I = table.INDEX
        rates = table.data[lo:k + 1, table._rates].mean(axis=0).tolist()  # adjacent rate columns
        r0 = table._rates.start
        arrival_rate, admitted_rate, completion_rate = (rates[I.arrival_rate - r0], rates[I.admitted_rate - r0],
                                                        rates[I.completion_rate - r0])
        cs = self.class_snap
        now = cs.data[k].tolist()
        class_rates = cs.data[lo:k + 1, :, cs.RATE].mean(axis=0).tolist()
        classes = {}
        for c, name in enumerate(self.core.class_names):
            v = now[c]
            v[cs.RATE] = class_rates[c]
            classes[name] = ClassLoad(*v)
        return Measurement(time_s=row.time_s, backlog=row.backlog, fill_in_progress=row.fill_in_progress,
                           ready=row.ready, active_decodes=row.active_decodes,
                           completion_rate=completion_rate, admitted_rate=admitted_rate,
                           decode_slots=row.decode_slots, fill_capacity=row.fill_capacity,
                           fill_workers=row.fill_workers, decode_workers=row.decode_workers,
                           fill_workers_starting=row.fill_workers_starting,
                           decode_workers_starting=row.decode_workers_starting,
                           arrival_rate=arrival_rate,
                           fill_queued_tokens=row.fill_queued_tokens, fill_token_capacity=row.fill_token_capacity,
                           decode_pass_s=row.decode_pass_s, decode_context_tokens=row.decode_context_tokens,
                           decode_batch_cap=row.decode_batch_cap, classes=classes)

    def apply_actions(self, action, source: str = "controller") -> list:
        """Apply what a controller returned: an admission command, a decode batch cap, a
        reservation (scale actions are returned for the fleet to apply)."""
        core = self.core
        acts = sort_actions(action)
        now = core.env.now
        if acts.admission is not None:
            core.action = acts.admission
            core.actions.append({"time_s": now, "kind": "admission", "rate": core.action.rate,
                                 "backlog_bound": core.action.backlog_bound})
        if acts.batch_cap is not None:
            core.decode.set_batch_cap(acts.batch_cap.batch_per_worker)
        if acts.reserve is not None:
            share = acts.reserve.fill_share
            if share != core.fill.reserve:
                core.actions.append({"time_s": now, "kind": "reserve", "fill_share": share,
                                     "decode_share": acts.reserve.decode_share, "controller": source})
            core.fill.reserve = share
        return acts.scales

    def control(self):
        """The admission controller's loop: sample, act, offer the deferred requests again."""
        core = self.core
        env, ctrl = core.env, core.ctrl
        ctrl.reset()
        yield env.timeout(core.cfg.snapshot_dt / 2)  # after the first snapshot
        while True:
            self.apply_actions(ctrl.update(env.now, self.measure(env.now, ctrl.sample_period)),
                               type(ctrl).__name__)
            if core.gate is not None and core.held:
                core.offer_held()
            core.kick_admission()
            yield env.timeout(ctrl.sample_period)

    def progress(self, horizon: float):
        # a line at once, then at every 5 % or at most a wall second apart (200 simulated steps),
        # with the time left at the current pace, so a long run shows progress from its start
        core = self.core
        env = core.env
        t0 = last = time.perf_counter()
        steps = 200

        def show(k: int) -> None:
            wall = time.perf_counter() - t0
            left = f", ~{wall * (steps - k) / k:.0f} s left" if 0 < k < steps and wall > 1 else ""
            print(f"\rsimulating: {100 * k / steps:5.1f} % of {horizon:,.0f} s simulated, {core.arrived:,} arrivals, "
                  f"{wall:.1f} s wall{left}   ", end="", file=sys.stderr, flush=True)

        show(0)
        for k in range(1, steps + 1):
            yield env.timeout(horizon / steps)
            now = time.perf_counter()
            if k % 10 == 0 or now - last >= 1.0:
                show(k)
                last = now
        print(file=sys.stderr)
