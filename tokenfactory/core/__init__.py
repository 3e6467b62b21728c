"""The core layer, below everything: what every other layer shares.

* :mod:`tokenfactory.core.errors` - :class:`ConfigError` (names the field and the allowed range),
  :class:`ConservationError`;
* :mod:`tokenfactory.core.validation` - the ``check_*`` / ``reject_unknown_keys`` helpers every
  config path goes through, and ``load_toml``;
* :mod:`tokenfactory.core.signals` - what passes between controllers and plants (measurements,
  actions);
* :mod:`tokenfactory.core.events` - disturbances a plant accepts;
* :mod:`tokenfactory.core.classes` - request classes and their SLOs.

Import from the modules; this package re-exports nothing.
"""

__all__: list[str] = []
