"""Optional OTLP/HTTP push of every snapshot's metric families."""
