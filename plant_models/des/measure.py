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
    :class:`tokenfactory.plant_models.des.simulator.Simulator` (a mixin)."""

    def start_snapshots(self, duration: float) -> None:
        """Allocate the time series and record its first row now."""
        dt = self.cfg.snapshot_dt
        rows = math.ceil(duration / dt - 1e-9)
        self.snap = SnapshotTable(rows, dt)
        self.class_snap = ClassSnapshotTable(rows, self.class_names)
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
        pass_sum, busy = 0.0, 0
        p = self.p
        for w in decode:
            n_dec += w.online
            dec_serving += not w.draining
            B = len(w.members)
            ctx = w.offset_sum + B * w.n
            held += ctx
            if B and w.online:  # the pass time its sequences see now
                pass_sum += p.decode_pass(B, ctx / B)[0] / (self.rate_factor * self.speed(w))
                busy += 1
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
        ctx_mean = held / self.decoding if self.decoding > 0 else self.nominal_ctx
        per_seq = p.kv_bytes(ctx_mean)
        kv_slots = self.kv_limit / per_seq if per_seq > 0 else math.inf
        fill_tokens = float(sum(self.tok_fill))
        token_cap = n_fill * self.fill_token_rate
        table.write(k, Snapshot(
            time_s=k * dt, backlog=len(self.backlog), fill_in_progress=self.fill_wip + self.in_transfer,
            ready=len(self.ready), active_decodes=self.decoding,
            decode_slots=n_dec * min(kv_slots, self.batch_cap),
            fill_capacity=n_fill * self.nominal_fill_rps, fill_workers=fill_serving, decode_workers=dec_serving,
            arrival_rate=self.arrived_since / dt, admission_rate=self.action.rate,
            admitted_rate=self.admitted_since / dt, completion_rate=self.completed_since / dt,
            arrived=self.arrived, completed=self.completed, rejected=self.rejected,
            fill_workers_starting=starting["fill"], decode_workers_starting=starting["decode"],
            fill_workers_billed=len(fill) + placed["fill"], decode_workers_billed=len(decode) + placed["decode"],
            fill_queued_tokens=fill_tokens, fill_token_capacity=token_cap,
            decode_pass_s=pass_sum / busy if busy else math.nan,
            decode_context_tokens=held / self.decoding if self.decoding > 0 else math.nan,
            decode_batch_cap=self.batch_cap, deferred=sum(self.c_deferred), aggregated_workers=n_agg))
        # per class: a new arrival waits for the tokens of its own and higher-priority levels
        lvl, tok = self.class_level, self.tok_fill
        rows = []
        for c in range(len(self.class_names)):
            ahead = sum(tok[j] for j in range(len(tok)) if lvl[j] <= lvl[c])
            rows.append((self.c_backlog[c], self.c_deferred[c], self.c_fip[c], tok[c], self.c_ready[c],
                         self.c_dec[c], self.c_arr_since[c] / dt, ahead / token_cap if token_cap > 0 else math.inf))
            self.c_arr_since[c] = 0
        self.class_snap.write(k, rows)
        self.completed_since = self.admitted_since = self.arrived_since = 0
        # nothing changes before the next pending event (the run's end at the latest)
        last = len(table.data) - 1
        nxt = max(k + 1, math.ceil(env.peek() / dt - 1e-9))
        table.hold(k, min(nxt - 1, last))
        self.class_snap.hold(k, min(nxt - 1, last))
        if nxt <= last:
            self._snap_k = nxt
            self.call_in(nxt * dt - env.now, self.snapshot)

    def measure(self, t: float, period: float) -> Measurement:
        """What a controller sampling every ``period`` sees at ``t``: the row of t minus the
        measurement delay, its rates averaged over the sample period, per class as well."""
        dt, table = self.cfg.snapshot_dt, self.snap
        k = min(max(int(round((t - self.cfg.measurement_delay_s) / dt)), 0), len(table) - 1)
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
        for c, name in enumerate(self.class_names):
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
        acts = sort_actions(action)
        now = self.env.now
        if acts.admission is not None:
            self.action = acts.admission
            self.actions.append({"time_s": now, "kind": "admission", "rate": self.action.rate,
                                 "backlog_bound": self.action.backlog_bound})
        if acts.batch_cap is not None:
            self.set_batch_cap(acts.batch_cap.batch_per_worker)
        if acts.reserve is not None:
            share = acts.reserve.fill_share
            if share != self.fill_reserve:
                self.actions.append({"time_s": now, "kind": "reserve", "fill_share": share,
                                     "decode_share": acts.reserve.decode_share, "controller": source})
            self.fill_reserve = share
        return acts.scales

    def control(self):
        """The admission controller's loop: sample, act, offer the deferred requests again."""
        env, ctrl = self.env, self.ctrl
        ctrl.reset()
        yield env.timeout(self.cfg.snapshot_dt / 2)  # after the first snapshot
        while True:
            self.apply_actions(ctrl.update(env.now, self.measure(env.now, ctrl.sample_period)),
                               type(ctrl).__name__)
            if self.gate is not None and self.held:
                self.offer_held()
            self.kick_admission()
            yield env.timeout(ctrl.sample_period)

    def progress(self, horizon: float):
        # a line at once, then at every 5 % or at most a wall second apart (200 simulated steps),
        # with the time left at the current pace, so a long run shows progress from its start
        env = self.env
        t0 = last = time.perf_counter()
        steps = 200

        def show(k: int) -> None:
            wall = time.perf_counter() - t0
            left = f", ~{wall * (steps - k) / k:.0f} s left" if 0 < k < steps and wall > 1 else ""
            print(f"\rsimulating: {100 * k / steps:5.1f} % of {horizon:,.0f} s simulated, {self.arrived:,} arrivals, "
                  f"{wall:.1f} s wall{left}   ", end="", file=sys.stderr, flush=True)

        show(0)
        for k in range(1, steps + 1):
            yield env.timeout(horizon / steps)
            now = time.perf_counter()
            if k % 10 == 0 or now - last >= 1.0:
                show(k)
                last = now
        print(file=sys.stderr)
