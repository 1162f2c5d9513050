"""A delay line between workers on 127.0.0.1: every byte arrives ``delay`` seconds after it
was sent, each way.

    python -m benchmarks.relay DELAY LISTEN:TARGET [LISTEN:TARGET ...]

Listens on 127.0.0.1:LISTEN for each pair and connects every accepted connection to
127.0.0.1:TARGET; what either side sends is read at once, held until ``delay`` seconds
after it was read, then written on. A round trip through it takes ``2 x delay`` more than
the loopback's own. Rate limits are the loopback's (``tc``), not the relay's: it only
delays. It stands in for a link's propagation delay where the kernel has no ``netem``.

Prints ``ready`` once it listens on every port; ends on SIGTERM.
"""

import asyncio
import signal
import sys
import time

_CHUNK = 1 << 20


async def _forward(reader, writer, delay):
    """Copies ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read."""
    queue = asyncio.Queue()

    async def send():
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(_CHUNK)
            queue.put_nowait((time.monotonic() + delay, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
    finally:
        writer.close()


async def _serve(listen, target, delay):
    async def connected(reader, writer):
        try:
            target_reader, target_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:  # the worker behind it has not started, or has ended
            writer.close()
            return
        await asyncio.gather(
            _forward(reader, target_writer, delay),
            _forward(target_reader, writer, delay),
            return_exceptions=True,
        )

    return await asyncio.start_server(connected, "127.0.0.1", listen)


async def _main(delay, pairs):
    servers = [await _serve(listen, target, delay) for listen, target in pairs]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


def parse_pairs(texts):
    """``["5001:6001", ...]`` -> ``[(5001, 6001), ...]``."""
    pairs = []
    for text in texts:
        listen, _, target = text.partition(":")
        if not (listen.isdigit() and target.isdigit()):
            raise ValueError(f"{text!r}: give LISTEN:TARGET ports")
        pairs.append((int(listen), int(target)))
    return pairs


def main(argv):
    delay, pairs = float(argv[0]), parse_pairs(argv[1:])
    asyncio.run(_main(delay, pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
