"""Controllers and their analysis: the common interface, admission controllers, tuning rules,
stability margins with exact delays, describing functions and oscillation detectors."""

from controllers.admission import *  # noqa: F401,F403
from controllers.admission import __all__ as _adm
from controllers.backtest import *  # noqa: F401,F403
from controllers.backtest import __all__ as _bt
from controllers.capacity import *  # noqa: F401,F403
from controllers.capacity import __all__ as _cap
from controllers.early_rejection import *  # noqa: F401,F403
from controllers.early_rejection import __all__ as _er
from controllers.forecasting import *  # noqa: F401,F403
from controllers.forecasting import __all__ as _fc
from controllers.autoscaling import *  # noqa: F401,F403
from controllers.autoscaling import __all__ as _as
from controllers.autotune import *  # noqa: F401,F403
from controllers.autotune import __all__ as _at
from controllers.describing import *  # noqa: F401,F403
from controllers.describing import __all__ as _df
from controllers.interface import *  # noqa: F401,F403
from controllers.interface import __all__ as _if
from controllers.oscillation import *  # noqa: F401,F403
from controllers.oscillation import __all__ as _osc
from controllers.reconfiguration import *  # noqa: F401,F403
from controllers.reconfiguration import __all__ as _rc
from controllers.response import *  # noqa: F401,F403
from controllers.response import __all__ as _resp
from controllers.stability import *  # noqa: F401,F403
from controllers.stability import __all__ as _st
from controllers.tuning import *  # noqa: F401,F403
from controllers.tuning import __all__ as _tu

__all__ = [*_if, *_adm, *_tu, *_at, *_st, *_df, *_osc, *_resp, *_fc, *_bt, *_cap, *_as, *_rc, *_er]
