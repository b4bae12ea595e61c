"""Holds idle and slow connections to the edge for a while, as a crowd of stalled phones
or a slowloris bot would, and reports how many it opened and how many the edge closed.

    python3 hold.py HOST PORT IDLE SLOW SECONDS

IDLE connections send nothing; SLOW ones send the start of a reservation request and then
one more header byte every 2 s, never finishing. Prints one JSON line when done.
"""
import asyncio
import json
import sys
import time

HEAD = b"POST /vouchers/SLOW/reservations HTTP/1.1\r\nHost: edge\r\nX-Slow: "


async def hold(host, port, slow, until, stats):
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        stats["failed"] += 1
        return
    stats["opened"] += 1
    try:
        if slow:
            writer.write(HEAD)
            await writer.drain()
        while time.monotonic() < until:
            try:
                # The edge closing the connection ends the read with b"" (or an answer).
                data = await asyncio.wait_for(reader.read(4096), timeout=2.0)
                if data == b"" or data:
                    stats["closed_by_edge"] += 1
                    return
            except asyncio.TimeoutError:
                pass
            if slow:
                writer.write(b"x")
                await writer.drain()
    except (ConnectionError, OSError):
        stats["closed_by_edge"] += 1
    finally:
        writer.close()


async def main():
    host, port, idle, slow, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    stats = {"opened": 0, "failed": 0, "closed_by_edge": 0}
    until = time.monotonic() + seconds
    tasks = []
    for i in range(idle + slow):
        tasks.append(asyncio.create_task(hold(host, port, i >= idle, until, stats)))
        if i % 500 == 499:
            await asyncio.sleep(0.05)  # do not look like a SYN flood to the kernel
    await asyncio.gather(*tasks)
    print(json.dumps({"idle": idle, "slow": slow, **stats}))


asyncio.run(main())
