"""tokenfactory: an LLM inference cluster as a plant with delayed feedback.

One import name, layered bottom to top (no import runs upward; ``tests/test_layers.py`` checks):

* :mod:`tokenfactory.core` - errors, validation, signals (what controllers see and command),
  events (disturbances plants accept), request classes;
* :mod:`tokenfactory.plant_models` - descriptors, the service model and the plants (fluid loop,
  pool model, request simulator); :mod:`tokenfactory.traces` - workloads;
* :mod:`tokenfactory.controllers` - controllers and their analysis (margins, describing
  functions, detectors, forecasting);
* :mod:`tokenfactory.registry` (controller kinds by name), :mod:`tokenfactory.scenario`,
  :mod:`tokenfactory.replay`, :mod:`tokenfactory.stack` (the layered stack); shipped scenario files
  in ``tokenfactory/scenarios``;
* :mod:`tokenfactory.studies` - runnable studies; :mod:`tokenfactory.cli` - the command line.
"""

from tokenfactory.core.errors import ConfigError, ConservationError

__version__ = "0.1.0"
__all__ = ["ConfigError", "ConservationError", "__version__"]
