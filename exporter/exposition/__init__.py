"""The Prometheus text format as the exporter reads it from other processes' pages: the parser, its
page plans and one page fetch. Shared by the engines plug-in and the progress collector, below both."""
