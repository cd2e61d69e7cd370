"""The exporter's own transports, below the plug-ins that use them: HTTP/1.1 GETs of engine pages
(`http1`, on h11) and unary gRPC calls over HTTP/2 to the kubelet (`grpc`, on h2).

Both replace heavier clients (aiohttp's client machinery, grpc.aio) to keep the exporter's memory
target; nothing here knows about engines, pods or collectors.
"""
