"""tokenfactory: an LLM inference cluster as a plant with delayed feedback.

The library lives in the flat packages ``plant_models`` (descriptors, service rates, plant
models), ``controllers`` (controllers and stability analysis), ``traces`` (workloads) and
``studies`` (runnable studies). This package holds the shared configuration helpers and the CLI.
"""

from tokenfactory.validation import ConfigError

__version__ = "0.1.0"
__all__ = ["ConfigError", "__version__"]
