"""Plant models: hardware and model descriptors, roofline service rates, stage memory."""

from plant_models.hardware import *  # noqa: F401,F403
from plant_models.hardware import __all__ as _hw
from plant_models.moe_model import *  # noqa: F401,F403
from plant_models.moe_model import __all__ as _mm
from plant_models.roofline import *  # noqa: F401,F403
from plant_models.roofline import __all__ as _rl
from plant_models.stage_memory import *  # noqa: F401,F403
from plant_models.stage_memory import __all__ as _sm

__all__ = [*_hw, *_mm, *_rl, *_sm]
