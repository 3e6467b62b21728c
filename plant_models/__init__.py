"""Plant models: hardware and model descriptors, the roofline, the service model, and the plants
(fluid loop, pool model, request simulator) with their events and results."""

from tokenfactory.plant_models.hardware import *  # noqa: F401,F403
from tokenfactory.plant_models.hardware import __all__ as _hw
from tokenfactory.plant_models.moe_model import *  # noqa: F401,F403
from tokenfactory.plant_models.moe_model import __all__ as _mm
from tokenfactory.plant_models.roofline import *  # noqa: F401,F403
from tokenfactory.plant_models.roofline import __all__ as _rl
from tokenfactory.plant_models.token_value import *  # noqa: F401,F403
from tokenfactory.plant_models.token_value import __all__ as _tv
from tokenfactory.plant_models.stage_memory import *  # noqa: F401,F403
from tokenfactory.plant_models.stage_memory import __all__ as _sm
from tokenfactory.plant_models.service import *  # noqa: F401,F403
from tokenfactory.plant_models.service import __all__ as _sv
from tokenfactory.core.events import *  # noqa: F401,F403  (re-exported: user code imports events from here)
from tokenfactory.core.events import __all__ as _ev
from tokenfactory.core.signals import *  # noqa: F401,F403  (re-exported: the plants' inputs and outputs)
from tokenfactory.core.signals import __all__ as _sg
from tokenfactory.plant_models.result import *  # noqa: F401,F403
from tokenfactory.plant_models.result import __all__ as _res
from tokenfactory.plant_models.fleet import *  # noqa: F401,F403
from tokenfactory.plant_models.fleet import __all__ as _flt
from tokenfactory.plant_models.delay import *  # noqa: F401,F403
from tokenfactory.plant_models.delay import __all__ as _dl
from tokenfactory.plant_models.fluid import *  # noqa: F401,F403
from tokenfactory.plant_models.fluid import __all__ as _fl
from tokenfactory.plant_models.lti import *  # noqa: F401,F403
from tokenfactory.plant_models.lti import __all__ as _lti
from tokenfactory.plant_models.des import *  # noqa: F401,F403
from tokenfactory.plant_models.des import __all__ as _des
from tokenfactory.plant_models.pools import *  # noqa: F401,F403
from tokenfactory.plant_models.pools import __all__ as _pools
from tokenfactory.plant_models.plant_protocol import *  # noqa: F401,F403
from tokenfactory.plant_models.plant_protocol import __all__ as _pp

__all__ = [*_hw, *_mm, *_rl, *_tv, *_sm, *_sv, *_ev, *_sg, *_res, *_flt, *_dl, *_fl, *_lti, *_des, *_pools, *_pp]
