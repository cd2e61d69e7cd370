"""gpupulse's Prometheus rules: sources (rules/, config.py over config.yaml) and the YAML rendered from them.

`rules/` holds the recording and alerting rules as data, `config.yaml` every threshold, window and
`for:` they use, `render.py` turns both into the `*.rules.yaml` beside them; `scripts/generate` writes
those and every other generated copy (the chart's, the docs').
"""
