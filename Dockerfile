# One image for the exporter (gpupulse-exporter) and the controller (gpupulse-remediation).
# NVML comes from the host driver, injected by the NVIDIA container runtime at run time.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter exporter
COPY remediation remediation
COPY dashboards dashboards
COPY demo demo
RUN pip install --no-cache-dir . && rm -rf /src
USER 65534
ENTRYPOINT []
CMD ["gpupulse-exporter"]
