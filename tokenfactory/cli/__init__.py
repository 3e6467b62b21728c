"""The ``tokenfactory`` command line.

Subcommands: ``describe`` (model, hardware, worker, controller kinds, the schema of every file a user
writes), ``margins`` (a scenario's stability
margins), ``certify`` (a stack scenario's certificate), ``forecast`` (backtests and a capacity plan), ``simulate`` (request-level replay),
``traces`` (list, info, fit, synth, fetch), ``calibrate`` (score or fit the service model against measured runs),
``study`` (runnable studies), ``report`` (the HTML report). Every error that
comes from a bad value is a :class:`ConfigError` and is printed as one line, exit status 2.

The package: :mod:`~tokenfactory.cli.arguments` builds the parser (one function per subcommand);
the handlers live by job in ``describe_commands``, ``simulate_commands`` (with the printed answer in
``replay_answers``), ``certify_commands`` (margins, certify, advise), ``trace_commands`` (traces,
forecast), ``calibrate_commands``, ``study_commands`` (study, report) and ``live_commands``
(emulate, gateway, diagnose, identify); ``console`` holds what they share.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tokenfactory.cli.arguments import build_parser
from tokenfactory.core.validation import ConfigError

__all__ = ["main", "build_parser"]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"tokenfactory: error: {exc}", file=sys.stderr)
        return 2

