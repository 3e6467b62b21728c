"""The project's exception types (bottom layer: imported by everything, imports nothing).

* :class:`ConfigError` - a configuration value is missing, unknown or out of range; ``field`` names it.
* :class:`ConservationError` - a simulation lost or invented requests.
"""

from __future__ import annotations

__all__ = ["ConfigError", "ConservationError"]


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range.

    Parameters
    ----------
    field : str
        Dotted path of the offending key (``"model.active_experts"``).
    message : str
        What is wrong and what is allowed.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")

    def __reduce__(self):  # raised in a worker process, re-raised in the parent: keep the fields
        return (_restore_error, (type(self), str(self), dict(self.__dict__)))


def _restore_error(cls, text: str, state: dict):
    err = cls.__new__(cls)
    Exception.__init__(err, text)
    err.__dict__.update(state)
    return err


class ConservationError(RuntimeError):
    """A simulation lost or invented requests: arrivals != completed + rejected + in system."""
