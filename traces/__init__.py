"""Traces: loaders for the shared public traces and user CSVs, statistics, and the embedded
synthetic workload (the default when no data is present)."""

from traces.loaders import *  # noqa: F401,F403
from traces.loaders import __all__ as _ld
from traces.schema import *  # noqa: F401,F403
from traces.schema import __all__ as _sc
from traces.stats import *  # noqa: F401,F403
from traces.stats import __all__ as _st
from traces.synthetic import *  # noqa: F401,F403
from traces.synthetic import __all__ as _sy

__all__ = [*_ld, *_sc, *_st, *_sy]
