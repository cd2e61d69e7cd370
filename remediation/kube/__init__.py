"""Kubernetes side of the remediation controller: API client, backend helpers, node locks, leader election.

Wiring (what `remediation serve --backend kubernetes` needs; see docs/design/kubernetes.md):

    from remediation.kube.runtime import connect

    runtime = await connect(KubeClientSettings(...), backend_settings, election_settings)
    engine: Engine | None = None

    async def lead() -> None:                  # runs only while this replica holds the leader Lease
        nonlocal engine
        engine = build_engine(settings, db_path, metrics, backend=runtime.backend)
        # build_engine recovers: actions the previous leader left `started` are verified, never repeated
        await run_worker_until_cancelled(engine)   # the intake worker feeding engine.handle/tick

    async def stopped() -> None:               # leadership lost or shutting down: stop acting at once
        if engine is not None:
            await engine.aclose()

    await runtime.elector.run(lead, stopped)

The backend also checks `elector.is_leader` before every write, so an action already in flight when
leadership is lost stops before its next API write. Two replicas must share one ledger (see the design
doc for what that takes); leader election alone does not prevent repeats.
"""
