"""Controllers and their analysis: the common interface, admission controllers, tuning rules,
stability margins with exact delays, describing functions and oscillation detectors."""

from tokenfactory.controllers.admission import *  # noqa: F401,F403
from tokenfactory.controllers.admission import __all__ as _adm
from tokenfactory.controllers.backtest import *  # noqa: F401,F403
from tokenfactory.controllers.backtest import __all__ as _bt
from tokenfactory.controllers.capacity import *  # noqa: F401,F403
from tokenfactory.controllers.capacity import __all__ as _cap
from tokenfactory.controllers.early_rejection import *  # noqa: F401,F403
from tokenfactory.controllers.early_rejection import __all__ as _er
from tokenfactory.controllers.forecasting import *  # noqa: F401,F403
from tokenfactory.controllers.forecasting import __all__ as _fc
from tokenfactory.controllers.autoscaling import *  # noqa: F401,F403
from tokenfactory.controllers.autoscaling import __all__ as _as
from tokenfactory.controllers.autotune import *  # noqa: F401,F403
from tokenfactory.controllers.autotune import __all__ as _at
from tokenfactory.controllers.describing import *  # noqa: F401,F403
from tokenfactory.controllers.describing import __all__ as _df
from tokenfactory.controllers.interface import *  # noqa: F401,F403
from tokenfactory.controllers.interface import __all__ as _if
from tokenfactory.controllers.oscillation import *  # noqa: F401,F403
from tokenfactory.controllers.oscillation import __all__ as _osc
from tokenfactory.controllers.reconfiguration import *  # noqa: F401,F403
from tokenfactory.controllers.reconfiguration import __all__ as _rc
from tokenfactory.controllers.response import *  # noqa: F401,F403
from tokenfactory.controllers.response import __all__ as _resp
from tokenfactory.controllers.stability import *  # noqa: F401,F403
from tokenfactory.controllers.stability import __all__ as _st
from tokenfactory.controllers.stability_batch import *  # noqa: F401,F403
from tokenfactory.controllers.stability_batch import __all__ as _sb
from tokenfactory.controllers.tuning import *  # noqa: F401,F403
from tokenfactory.controllers.tuning import __all__ as _tu
from tokenfactory.controllers.envelope_tuner import *  # noqa: F401,F403
from tokenfactory.controllers.envelope_tuner import __all__ as _et
from tokenfactory.controllers.planning import *  # noqa: F401,F403
from tokenfactory.controllers.planning import __all__ as _pl
from tokenfactory.controllers.separation import *  # noqa: F401,F403
from tokenfactory.controllers.separation import __all__ as _sep
from tokenfactory.controllers.control_stack import *  # noqa: F401,F403
from tokenfactory.controllers.control_stack import __all__ as _stk
from tokenfactory.controllers.batch_gate import *  # noqa: F401,F403
from tokenfactory.controllers.batch_gate import __all__ as _bg
from tokenfactory.controllers.slo_admission import *  # noqa: F401,F403
from tokenfactory.controllers.slo_admission import __all__ as _slo

__all__ = [*_if, *_adm, *_tu, *_et, *_at, *_st, *_sb, *_df, *_osc, *_resp, *_fc, *_bt, *_cap, *_as, *_rc, *_er, *_pl, *_sep,
           *_stk, *_bg, *_slo]
