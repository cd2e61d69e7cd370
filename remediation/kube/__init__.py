"""Kubernetes side of the remediation controller: API client, backend helpers, node locks, leader election.

    client.py     the only module that imports kubernetes_asyncio (one API connection, deadlines)
    runtime.py    connect(): the client, the Kubernetes backend and (optionally) the leader elector
    serve.py      `serve --backend kubernetes`: the wiring, the leader-only engine, EngineProxy
    leader.py     Lease-based leader election; lease.py the Lease records it swaps
    nodelock.py   per-node Leases that keep two actions off one node; eviction.py, pods.py, nodes.py
    nodelabels.py a Node's labels for the scope's node selector; timing.py clocks and sleeping

Only the leader opens the ledger and drains the inbox; a follower keeps accepting alerts. The backend
also checks `elector.is_leader` before every write, so an action already in flight when leadership is
lost stops before its next API write. Two replicas must share one ledger (see
docs/design/kubernetes.md for what that takes); leader election alone does not prevent repeats.
"""
