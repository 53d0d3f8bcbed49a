"""A TCP proxy that paces every byte it brings back from its upstream to one rate,
shared by all its connections: a store whose egress is throttled as a whole, whoever
asks (what `--backend-rate` cannot model for a cluster, as it paces each node alone).

    python paceproxy.py LISTEN_PORT UPSTREAM_PORT BYTES_PER_SEC

Bytes toward the upstream pass unpaced. Prints "ready" once it listens.
"""
import asyncio, sys, time

CHUNK = 64 << 10
# As the node's own pacer: a piece that comes a little late takes up the time lost.
CATCH_UP = 0.02


class Pace:
    def __init__(self, rate):
        self.rate = float(rate)
        self.next = time.monotonic()

    def turn(self, n):
        now = time.monotonic()
        at = max(self.next, now - CATCH_UP)
        self.next = at + n / self.rate
        return self.next


async def pipe(reader, writer, pace=None):
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            if pace:
                wait = pace.turn(len(data)) - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main(listen, upstream, rate):
    pace = Pace(rate)

    async def serve(cr, cw):
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, uw), pipe(ur, cw, pace))

    server = await asyncio.start_server(serve, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
