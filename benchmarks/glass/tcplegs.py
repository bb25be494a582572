#!/usr/bin/env python3
"""Which TCP leg holds data: samples /proc/net/tcp every ~0.5 ms for SECONDS and, for the sockets to and
from an nginx-rtmp listening on PORT, reports the episodes during which a socket had data not yet
acknowledged (tx_queue > 0). An episode of 40 ms or more is a delayed ACK; with Nagle on that socket,
whatever was written meanwhile waited for it. Used to place the glass-to-glass tail (benchmarks/README.md).

    tcplegs.py PORT SECONDS
"""
import sys, time
port = int(sys.argv[1]); seconds = float(sys.argv[2])
hexport = "%04X" % port
# per socket (local,remote) -> start of the current nonzero tx_queue episode
start = {}; episodes = {}
end = time.monotonic() + seconds
while time.monotonic() < end:
    now = time.monotonic()
    seen = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            p = line.split()
            local, remote, st, q = p[1], p[2], p[3], p[4]
            if st != "01": continue
            lp, rp = local.split(":")[1], remote.split(":")[1]
            if lp == hexport: leg = "nginx->reader"
            elif rp == hexport: leg = "publisher->nginx"
            else: continue
            tx = int(q.split(":")[0], 16)
            key = (leg, local, remote)
            if tx > 0:
                start.setdefault(key, now)
                seen.add(key)
    for key in list(start):
        if key not in seen:
            d = now - start.pop(key)
            episodes.setdefault(key[0], []).append(d * 1000)
    time.sleep(0.0005)
for leg, ds in episodes.items():
    ds.sort()
    print(leg, "episodes", len(ds), "over 20 ms:", sum(1 for d in ds if d > 20), "over 35 ms:", sum(1 for d in ds if d > 35), "longest", [round(x,1) for x in ds[-8:]])
