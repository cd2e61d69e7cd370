"""The exporter's garbage-collector policy: garbage cycles that died old are freed within a minute.

Run in a fresh interpreter: freezing the heap of the test process would keep every test's objects
for the rest of the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, json, weakref
    from exporter import gcpolicy

    class Node:
        pass

    def promoted_cycle():
        node = Node()
        node.self = node  # a cycle: refcounting alone never frees it
        gc.collect(0)
        gc.collect(1)  # survived two young collections: in the oldest generation now
        return weakref.ref(node)

    async def closed_connection():
        # asyncio's real selector transport, alive across young collections, then closed
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        transport = weakref.ref(writer.transport)
        gc.collect(0)
        gc.collect(1)
        await reader.read()  # the server closed it
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        del reader, writer
        return transport

    async def main():
        gc.collect()
        gcpolicy.freeze_startup()
        cycle = promoted_cycle()
        transport = await closed_connection()
        for _ in range(3):
            gc.collect(0)
            gc.collect(1)
        before = {"cycle": cycle() is not None, "transport": transport() is not None}

        slept = []
        second = asyncio.Event()

        async def sleep(seconds):
            slept.append(seconds)
            if len(slept) > 1:
                second.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(gcpolicy.collect_periodically(60.0, sleep))
        await second.wait()  # one collection done, waiting for the next
        task.cancel()
        after = {"cycle": cycle() is not None, "transport": transport() is not None}
        print(json.dumps({"before": before, "after": after, "slept": slept}))

    asyncio.run(main())
    """
)


def _run() -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True, timeout=60
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_young_collections_keep_cycles_that_died_old_and_the_periodic_full_one_frees_them() -> None:
    result = _run()
    # the problem: after the freeze, young collections never free a cycle that died in the oldest
    # generation, and a closed asyncio connection is such a cycle
    assert result["before"] == {"cycle": True, "transport": True}
    # the periodic full collection frees both, and waits its interval before each collection
    assert result["after"] == {"cycle": False, "transport": False}
    assert result["slept"] == [60.0, 60.0]
