"""`PartitionGate`: one partition at a time, first come first served, cancellation-safe."""

from __future__ import annotations

import asyncio

import pytest

from vero.sidecar.gate import PartitionGate

pytestmark = pytest.mark.timeout(30)


def test_one_partition_at_a_time_in_arrival_order_and_a_cancelled_waiter_frees_its_turn():
    async def scenario() -> list[str]:
        gate = PartitionGate()
        events: list[str] = []
        release = {name: asyncio.Event() for name in ("a1", "b1", "a2", "c1", "a3")}

        async def job(name: str) -> None:
            async with gate.enter(name[0]):
                events.append(f"+{name}")
                await release[name].wait()
                events.append(f"-{name}")

        tasks = {}
        for name in ("a1", "b1", "a2", "c1"):
            tasks[name] = asyncio.create_task(job(name))
            await asyncio.sleep(0.01)
        assert events == ["+a1"] and gate.partition == "a"  # a2 waits behind b1, although a holds the gate
        tasks["b1"].cancel()  # b1 gives up its turn while waiting: a2 (same partition as the holder) goes in
        await asyncio.sleep(0.01)
        assert events == ["+a1", "+a2"]
        tasks["a3"] = asyncio.create_task(job("a3"))  # c1 waits: a3 queues behind it
        await asyncio.sleep(0.01)
        assert events == ["+a1", "+a2"]
        release["a1"].set()
        release["a2"].set()
        await asyncio.sleep(0.01)
        assert events[-1] == "+c1" and gate.partition == "c"
        release["c1"].set()
        release["a3"].set()
        await asyncio.gather(*(t for n, t in tasks.items() if n != "b1"))
        with pytest.raises(asyncio.CancelledError):
            await tasks["b1"]
        assert gate.partition is None
        return events

    events = asyncio.run(scenario())
    assert events == ["+a1", "+a2", "-a1", "-a2", "+c1", "-c1", "+a3", "-a3"]
