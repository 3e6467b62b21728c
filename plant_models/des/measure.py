"""Measurement and control: the recorded time series, what controllers see, when they act.

Every ``snapshot_dt`` the simulator records a :class:`~tokenfactory.plant_models.des.records.Snapshot`
(a scheduled call; through a stretch in which no event is pending the row is held by one table
write instead of one call per sample, which is what makes sparse long runs cheap).
A controller sampled at t sees the row of t - ``measurement_delay_s`` (rates averaged over its
sample period, as a scrape of counters gives) as a :class:`tokenfactory.signals.Measurement`;
its admission action holds until its next sample. Pool autoscalers see the same measurements
(:mod:`tokenfactory.plant_models.des.fleet`).
"""

from __future__ import annotations

import math
import sys
import time

from tokenfactory.plant_models.des.records import Snapshot, SnapshotTable
from tokenfactory.signals import AdmissionAction, Measurement

__all__ = ["Monitor"]


class Monitor:
    """Snapshots, measurements and the admission control loop of
    :class:`tokenfactory.plant_models.des.core.Simulator` (a mixin)."""

    def start_snapshots(self, duration: float) -> None:
        dt = self.cfg.snapshot_dt
        self.snap = SnapshotTable(math.ceil(duration / dt - 1e-9), dt)
        self._snap_k = 0
        self.call_in(0.0, self.snapshot)

    def snapshot(self) -> None:
        """Record row k (at k x snapshot_dt), hold it through the quiet stretch before the next
        event, and come back at the first sample time after that event."""
        env, dt, table = self.env, self.cfg.snapshot_dt, self.snap
        k = self._snap_k
        decode, fill = self.decode_workers, self.fill_workers
        n_dec = dec_serving = n_fill = fill_serving = 0
        held = 0.0
        for w in decode:
            n_dec += w.online
            dec_serving += not w.draining
            held += w.offset_sum + len(w.members) * w.n
        for w in fill:
            n_fill += w.online
            fill_serving += not w.draining
        n_agg = len(self.aggregated_workers)
        for w in self.aggregated_workers:  # serving both roles
            held += w.offset_sum + len(w.members) * w.n
        n_dec += n_agg
        dec_serving += n_agg
        n_fill += n_agg
        fill_serving += n_agg
        starting = {"fill": 0, "decode": 0}
        placed = {"fill": 0, "decode": 0}
        for tk in self.tickets:
            if not tk.cancelled:
                starting[tk.pool] += 1
                placed[tk.pool] += tk.placed
        # slots as an orchestrator would estimate them: KV capacity / the KV of a sequence at the
        # mean context of those decoding now (the nominal context when nothing decodes)
        per_seq = self.p.kv_bytes(held / self.decoding if self.decoding > 0 else self.nominal_ctx)
        table.write(k, Snapshot(
            time_s=k * dt, backlog=len(self.backlog), fill_in_progress=self.fill_wip + self.in_transfer,
            ready=len(self.ready), active_decodes=self.decoding,
            decode_slots=n_dec * self.kv_limit / per_seq if per_seq > 0 else math.inf,
            fill_capacity=n_fill * self.nominal_fill_rps, fill_workers=fill_serving, decode_workers=dec_serving,
            arrival_rate=self.arrived_since / dt, admission_rate=self.action.rate,
            admitted_rate=self.admitted_since / dt, completion_rate=self.completed_since / dt,
            arrived=self.arrived, completed=self.completed, rejected=self.rejected,
            fill_workers_starting=starting["fill"], decode_workers_starting=starting["decode"],
            fill_workers_billed=len(fill) + placed["fill"], decode_workers_billed=len(decode) + placed["decode"],
            aggregated_workers=n_agg))
        self.completed_since = self.admitted_since = self.arrived_since = 0
        # nothing changes before the next pending event (the run's end at the latest)
        last = len(table.data) - 1
        nxt = max(k + 1, math.ceil(env.peek() / dt - 1e-9))
        table.hold(k, min(nxt - 1, last))
        if nxt <= last:
            self._snap_k = nxt
            self.call_in(nxt * dt - env.now, self.snapshot)

    def measure(self, t: float, period: float) -> Measurement:
        """What a controller sampling every ``period`` sees at ``t``."""
        dt, table = self.cfg.snapshot_dt, self.snap
        k = min(max(int(round((t - self.cfg.measurement_delay_s) / dt)), 0), len(table) - 1)
        row = table.row(k)
        lo = max(0, k - max(1, int(round(period / dt))) + 1)
        return Measurement(time_s=row.time_s, backlog=row.backlog, fill_in_progress=row.fill_in_progress,
                           ready=row.ready, active_decodes=row.active_decodes,
                           completion_rate=table.mean(lo, k, "completion_rate"),
                           admitted_rate=table.mean(lo, k, "admitted_rate"),
                           decode_slots=row.decode_slots, fill_capacity=row.fill_capacity,
                           fill_workers=row.fill_workers, decode_workers=row.decode_workers,
                           fill_workers_starting=row.fill_workers_starting,
                           decode_workers_starting=row.decode_workers_starting,
                           arrival_rate=table.mean(lo, k, "arrival_rate"))

    def control(self):
        env, ctrl = self.env, self.ctrl
        ctrl.reset()
        yield env.timeout(self.cfg.snapshot_dt / 2)  # after the first snapshot
        while True:
            a = ctrl.update(env.now, self.measure(env.now, ctrl.sample_period))
            self.action = a if isinstance(a, AdmissionAction) else AdmissionAction(float(a))
            self.actions.append({"time_s": env.now, "kind": "admission", "rate": self.action.rate,
                                 "backlog_bound": self.action.backlog_bound})
            self.kick_admission()
            yield env.timeout(ctrl.sample_period)

    def progress(self, horizon: float):
        env = self.env
        t0 = time.perf_counter()
        for k in range(1, 21):
            yield env.timeout(horizon / 20)
            print(f"\rsimulating: {5 * k:3d} % of {horizon:.0f} s simulated, {self.arrived} arrivals, "
                  f"{time.perf_counter() - t0:.1f} s wall", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
