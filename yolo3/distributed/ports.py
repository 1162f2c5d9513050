"""Free TCP ports for workers on this machine, drawn where the kernel hands out none itself.

A port found free is free only until something binds it, and a worker binds its port
seconds after it was chosen (TensorFlow starts first). In that time the kernel may give the
same port to an outgoing connection of any process here, the other workers' own gRPC
channels among them, if the port lies in the local ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``); the worker then cannot listen and the job
ends. A port asked of the kernel with ``bind(port 0)`` always lies in that range, so ports
here are drawn at random from outside it (and above the ports services commonly take),
and kept where a bind succeeds now. The draw uses the operating system's randomness, so
two processes that seeded Python's generator alike do not draw alike.

This module imports no TensorFlow: the launcher uses it.
"""

import contextlib
import random
import socket

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
# Where the file is missing (not Linux): Linux's default range up to the end of IANA's
# dynamic range (49152-65535, the default elsewhere).
ASSUMED_EPHEMERAL = (32768, 65535)
# Ports below this are left alone: 8080, 8888, 9000 and the like are taken by services.
LOWEST = 15000
HIGHEST = 65535
ATTEMPTS = 500

_draw = random.SystemRandom()


def ephemeral_range(path=EPHEMERAL_RANGE_FILE):
    """``(low, high)``, inclusive, of the ports the kernel gives outgoing connections."""
    try:
        with open(path, encoding="ascii") as f:
            low, high = (int(value) for value in f.read().split())
    except (OSError, ValueError):
        return ASSUMED_EPHEMERAL
    return low, high


def _starts(count, ephemeral):
    """Inclusive ranges of the first ports P of P..P+count-1 that miss ``ephemeral``."""
    low, high = ephemeral
    spans = [(LOWEST, min(low - 1, HIGHEST)), (max(high + 1, LOWEST), HIGHEST)]
    return [(a, b - count + 1) for a, b in spans if b - count + 1 >= a]


def _pick(spans):
    sizes = [b - a + 1 for a, b in spans]
    index = _draw.randrange(sum(sizes))
    for (a, _), size in zip(spans, sizes):
        if index < size:
            return a + index
        index -= size
    raise AssertionError("unreachable")


def free_ports(count, host="", *, consecutive=False, ephemeral=None):
    """``count`` distinct TCP ports free on ``host`` now ("": every interface, which is where
    TensorFlow's server listens whatever host its cluster names), outside the ephemeral
    range (``ephemeral``: its ``(low, high)``; by default this machine's).

    ``consecutive``: P, P+1, ..., P+count-1, as a Slurm port base needs (task k of a node
    listens on base + k). Another process may still bind a port between this call and the
    worker's start, but no connection of the kernel's choosing will.
    """
    if count < 1:
        raise ValueError(f"asked for {count} ports: need at least one")
    ephemeral = ephemeral or ephemeral_range()
    spans = _starts(count if consecutive else 1, ephemeral)
    if not spans:
        raise OSError(
            f"no {count} {'consecutive ' if consecutive else ''}ports between {LOWEST} and "
            f"{HIGHEST} lie outside the ephemeral range {ephemeral[0]}-{ephemeral[1]}; "
            f"narrow it in {EPHEMERAL_RANGE_FILE}"
        )
    chosen = []
    with contextlib.ExitStack() as held:
        for _ in range(ATTEMPTS):
            first = _pick(spans)
            # A port drawn twice fails its second bind: the first one's socket is held.
            wanted = list(range(first, first + count)) if consecutive else [first]
            sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in wanted]
            try:
                for sock, port in zip(sockets, wanted):
                    sock.bind((host, port))
            except OSError:
                for sock in sockets:
                    sock.close()
                continue
            for sock in sockets:
                held.callback(sock.close)
            chosen.extend(wanted)
            if len(chosen) == count:
                return chosen
    raise OSError(f"found no {count} free ports on {host or 'every interface'} in {ATTEMPTS} draws")


def free_port(host=""):
    """One TCP port free on ``host`` now (see :func:`free_ports`)."""
    return free_ports(1, host)[0]
