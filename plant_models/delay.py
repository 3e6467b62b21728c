"""Exact pure delays in the time domain.

A :class:`DelayLine` stores a signal's history on the simulation grid and returns its value
``delay`` seconds ago by linear interpolation between grid points, so a delay that is a multiple
of the step is reproduced exactly (no Pade approximation in simulation; Pade is for analysis only).
"""

from __future__ import annotations

import numpy as np

__all__ = ["DelayLine"]


class DelayLine:
    """History of one signal sampled every ``dt``; ``read(delay)`` = value ``delay`` s ago.

    Before the first push the line returns ``initial`` (the signal's value for t < 0).

    A ring buffer of ``ceil(max_delay / dt) + 2`` samples, so reads cost O(1) however long the
    simulation.

    Parameters
    ----------
    dt : float
        Sample spacing of the pushes (s, > 0): the simulation step.
    max_delay : float
        Longest delay that will be read (s, >= 0).
    initial : float
        Value returned for times before the first sample (default 0), in the signal's units.

    Raises
    ------
    ValueError
        For ``dt`` <= 0 or ``max_delay`` < 0.
    """

    def __init__(self, dt: float, max_delay: float, initial: float = 0.0):
        if dt <= 0:
            raise ValueError(f"dt must be > 0, got {dt}")
        if max_delay < 0:
            raise ValueError(f"max_delay must be >= 0, got {max_delay}")
        self.dt = dt
        self.size = int(np.ceil(max_delay / dt)) + 2
        self._initial = float(initial)
        self._buf = np.full(self.size, self._initial)
        self._n = 0  # samples pushed so far

    def push(self, value: float) -> None:
        """Append the newest sample (one per ``dt``).

        Parameters
        ----------
        value : float
            The signal's value at this step.
        """
        self._buf[self._n % self.size] = value
        self._n += 1

    def read(self, delay: float) -> float:
        """Value ``delay`` seconds before the newest sample (delay 0 = newest).

        Parameters
        ----------
        delay : float
            How far back (s, >= 0, at most the line's ``max_delay``); between grid points the
            value is interpolated linearly.

        Returns
        -------
        float
            The delayed value; ``initial`` for times before the first push.

        Raises
        ------
        ValueError
            When ``delay`` exceeds the line's capacity.
        """
        steps = delay / self.dt
        k = int(steps)
        frac = steps - k
        if k + 1 >= self.size:
            raise ValueError(f"delay {delay} s exceeds the line's capacity {(self.size - 2) * self.dt} s")
        newest = self._n - 1
        a = self._at(newest - k)
        if frac < 1e-12:
            return a
        b = self._at(newest - k - 1)
        return (1.0 - frac) * a + frac * b

    def _at(self, index: int) -> float:
        return self._initial if index < 0 else float(self._buf[index % self.size])
