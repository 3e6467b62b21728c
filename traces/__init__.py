"""Traces: loaders for the shared public traces and user CSVs, statistics, and the embedded
synthetic workload (the default when no data is present)."""

from tokenfactory.traces.loaders import *  # noqa: F401,F403
from tokenfactory.traces.loaders import __all__ as _ld
from tokenfactory.traces.schema import *  # noqa: F401,F403
from tokenfactory.traces.schema import __all__ as _sc
from tokenfactory.traces.stats import *  # noqa: F401,F403
from tokenfactory.traces.stats import __all__ as _st
from tokenfactory.traces.synthetic import *  # noqa: F401,F403
from tokenfactory.traces.synthetic import __all__ as _sy

from tokenfactory.traces.transforms import *  # noqa: F401,F403
from tokenfactory.traces.transforms import __all__ as _tf
from tokenfactory.traces.rates import *  # noqa: F401,F403
from tokenfactory.traces.rates import __all__ as _rt
from tokenfactory.traces.class_assignment import *  # noqa: F401,F403
from tokenfactory.traces.class_assignment import __all__ as _cl
from tokenfactory.traces.rate_workloads import *  # noqa: F401,F403
from tokenfactory.traces.rate_workloads import __all__ as _rw

from tokenfactory.traces.closed_loop import *  # noqa: F401,F403
from tokenfactory.traces.closed_loop import __all__ as _clc

__all__ = [*_ld, *_sc, *_st, *_sy, *_tf, *_rt, *_cl, *_rw, *_clc]
