"""The exporter's Kubernetes API access: the service-account client and the list+watch reflector."""
