"""The shared kernel of gpupulse: what the exporter, the controller, the rules and the dashboards agree on.

It holds the alert/controller contract (`contract`, `xid`), the one clock protocol (`clock`), the one
duration grammar (`durations`), the one log setup (`logs`) and every metric spec (`metrics`). Both
services import it and nothing else crosses between them. It imports neither service, nor alerts,
dashboards, demo, bench or tests (an import-linter contract in pyproject.toml enforces this).
"""
