"""A TCP proxy on 127.0.0.1 that delays every byte from the server by a fixed time (bench only).

``python bench/_latency_proxy.py <upstream host:port> <delay ms>`` prints ``{"endpoint": "http://127.0.0.1:<port>"}``
and forwards until its stdin closes. Why: the bench VM's kernel has no ``sch_netem`` (``tc qdisc ...
netem`` answers "qdisc kind is unknown"), and on loopback every GET answers in well under a
millisecond, so how many requests a client keeps in flight never shows. Behind this proxy each answer
arrives ``delay`` later, as from a store a round trip away, without limiting throughput: chunks are
queued with their arrival time and each is written once its time has come, so answers on different
connections (and later chunks of one) overlap their delays.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


async def _pump_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def _pump_down(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def later() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(later())
    try:
        while data := await reader.read(1 << 16):
            queue.put_nowait((time.monotonic() + delay, data))
    finally:
        queue.put_nowait((0.0, b""))
        await sender


async def main(upstream: str, delay_ms: float) -> None:
    host, _, port = upstream.rpartition(":")
    delay = delay_ms / 1000

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(host, int(port))
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pump_up(client_r, up_w), _pump_down(up_r, client_w, delay), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    port_ = server.sockets[0].getsockname()[1]
    print(json.dumps({"endpoint": f"http://127.0.0.1:{port_}"}), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin
    server.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
