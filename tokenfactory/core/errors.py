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
        super().__init__(f"{field}: {message}")


class ConservationError(RuntimeError):
    """A simulation lost or invented requests: arrivals != completed + rejected + in system."""
