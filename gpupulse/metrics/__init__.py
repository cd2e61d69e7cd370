"""Every metric spec gpupulse exports: `spec` (the shape and naming rules), one module per producing
part (`gpu`, `engines`, `attribution`, `pagecache`, `exporter_self`, `controller`), and `catalog`
(all of them, and the docs/metrics.md generator)."""
