"""`python -m remediation` runs the gpupulse-remediation command line."""

from .cli import main

raise SystemExit(main())
