#!/usr/bin/env python3
"""A UDP path of our own for the tests: datagrams from the first peer to LISTEN go to TARGET through a
token bucket (RATE bytes per second, read again from RATE_FILE when it changes) with a queue of 300 ms
at that rate, dropped at its tail when full, as a router's; the replies go back at once.

    udp-throttle.py LISTEN_PORT TARGET_PORT RATE_FILE      (127.0.0.1 on both sides)
"""
import collections
import os
import select
import socket
import sys
import time

listen_port, target_port, rate_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


def read_rate(default):
    try:
        with open(rate_file) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return default


rate = read_rate(1_000_000)
rate_mtime = 0.0
front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
front.bind(("127.0.0.1", listen_port))
back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
back.bind(("127.0.0.1", 0))
peer = None
queue, queued = collections.deque(), 0
tokens, last = 0.0, time.monotonic()
print(f"udp-throttle: 127.0.0.1:{listen_port} -> 127.0.0.1:{target_port}", flush=True)
while True:
    try:
        mtime = os.stat(rate_file).st_mtime
        if mtime != rate_mtime:
            rate_mtime, rate = mtime, read_rate(rate)
    except OSError:
        pass
    ready, _, _ = select.select([front, back], [], [], 0.002)
    now = time.monotonic()
    tokens = min(tokens + (now - last) * rate, 3000.0)
    last = now
    for sock in ready:
        data, address = sock.recvfrom(65536)
        if sock is front:
            peer = address
            if queued + len(data) > rate * 0.3:
                continue  # the queue is full: dropped, as a router drops
            queue.append(data)
            queued += len(data)
        elif peer is not None:
            front.sendto(data, peer)
    while queue and tokens >= len(queue[0]):
        data = queue.popleft()
        queued -= len(data)
        tokens -= len(data)
        back.sendto(data, ("127.0.0.1", target_port))
