#!/usr/bin/env python3
"""A live stream through a dip of its path (issue 36 item 2): broadcast with and without --adaptive,
and ffmpeg's plain `-f flv` stream, side by side.

The path: a TCP token-bucket proxy of our own (below) in front of a local nginx-rtmp that records
what it receives (bench.py's Nginx). The proxy's rate is --high-kbit (6 Mbit/s), then --low-kbit
(1.2 Mbit/s: 40 % of the stream's 3 Mbit/s) for --dip seconds, then --high-kbit again. broadcast
streams a 1280x720 X11 screen (Xvfb, ffplay showing testsrc2 over it) and the test tone at --video-bitrate 3M (CBR, veryfast, zerolatency) to the
proxy and records beside it (--record rec.mkv). Measured per second of media:

- frames the server got (ffprobe of nginx's recording: video packet pts, bucketed by second) and the
  bytes of them (the stream's bitrate as delivered);
- the stream's target bitrate (the log's "adapting: video at N of M kb/s" lines) and its backlog
  (the status line, twice a second: broadcast runs on a pty so it writes its interactive line);
- the recording's frames and bitrate per second, against the frames its encoder made (the summary);
- reconnects and the max backlog (the stream's summary line).

For ffmpeg (it blocks in its write, it drops nothing) every media second reaches the server late;
its lag is the wall time it ran past the media's length, reported as its "backlog". ffmpeg grabs
the same screen (x11grab) and streams it at the same x264 settings, CBR with nal-hrd filler as a
fixed-rate stream is sent (broadcast's adaptive stream drops the filler: its bitrate changes).

Nothing here is a pass/fail threshold; the goals are printed beside the figures.

Usage: benchmarks/dip.py --broadcast PATH [--runs 1] [--modes adaptive,fixed,ffmpeg] [--out out/dip]
"""

import argparse
import json
import os
import pty
import re
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from bench import FF, X264, Nginx, XScreen, machine, x264_rc  # noqa: E402

W, H, FPS = 1280, 720, 30


class ThrottlingProxy:
    """127.0.0.1:port → target; the client-to-server direction held to `rate` bytes/s by a token
    bucket (each chunk waits for its bytes at the rate in force; at most 50 ms of credit), with a
    small receive buffer and 1448-byte segments so the slowness reaches the sender's socket within
    a few KB, as on a real path."""

    def __init__(self, target, bits_per_second):
        self.target = target
        self.rate = bits_per_second / 8
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        # An Ethernet path's segment size, not loopback's 64 KB: with 64 KB segments the sender's
        # send buffer autotunes to 4 MB (seen: ffmpeg's socket held 1.8 MB, 5 s of the stream, and
        # never blocked through the dip); a real path's would stay far smaller.
        self.listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1448)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.sent = []  # (monotonic time, bytes) of the throttled direction
        threading.Thread(target=self._accept, daemon=True).start()

    def set_rate(self, bits_per_second):
        self.rate = bits_per_second / 8

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src, dst, throttled):
        due = time.monotonic()
        try:
            while True:
                chunk = max(512, int(self.rate / 50)) if throttled else 65536
                data = src.recv(chunk)
                if not data:
                    break
                dst.sendall(data)
                if throttled:
                    now = time.monotonic()
                    self.sent.append((now, len(data)))
                    due = max(due, now - 0.05) + len(data) / self.rate
                    if due > now:
                        time.sleep(due - now)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


class PtyReader:
    """Runs cmd with stderr on a pty (so broadcast writes its status line twice a second) and
    collects (monotonic time, line) for every \\r- or \\n-terminated line."""

    def __init__(self, cmd):
        master, slave = pty.openpty()
        self.start = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        self.master = master
        self.lines = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        buf = b""
        while True:
            try:
                r, _, _ = select.select([self.master], [], [], 0.5)
                if not r:
                    if self.proc.poll() is not None:
                        break
                    continue
                data = os.read(self.master, 65536)
            except OSError:
                break
            if not data:
                break
            buf += data
            parts = re.split(rb"[\r\n]", buf)
            buf = parts.pop()
            now = time.monotonic()
            for p in parts:
                if p.strip():
                    self.lines.append((now, p.decode(errors="replace")))
        if buf.strip():
            self.lines.append((time.monotonic(), buf.decode(errors="replace")))

    def wait_for(self, text, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for t, line in list(self.lines):
                if text in line:
                    return t
            if self.proc.poll() is not None:
                return None
            time.sleep(0.05)
        return None

    def wait(self, timeout):
        rc = self.proc.wait(timeout=timeout)
        self.thread.join(timeout=5)
        return rc


def packets(path, stream="v", with_pos=False):
    """(pts seconds, bytes[, byte position]) of one stream's packets."""
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", stream, "-show_entries",
                          "packet=pts_time,size,pos", "-of", "csv=p=0", path], capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.strip().split(",")
        try:
            row = (float(parts[0]), int(parts[1]), int(parts[2]))
        except (ValueError, IndexError):
            continue
        rows.append(row if with_pos else row[:2])
    return rows


def per_second(rows, seconds):
    frames, bits = [0] * seconds, [0] * seconds
    for pts, size in rows:
        s = int(pts)
        if 0 <= s < seconds:
            frames[s] += 1
            bits[s] += 8 * size
    return frames, bits


def clock_seconds(text):
    h, m, s = text.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def run_one(args, mode, work, nginx, display, index):
    proxy = ThrottlingProxy(nginx.port, args.high_kbit * 1000)
    name = f"{mode}{index}"
    url = f"rtmp://127.0.0.1:{proxy.port}/live/{name}"
    rec = os.path.join(work, f"rec-{name}.mkv")
    total = args.before + args.dip + args.after
    if mode == "ffmpeg":
        cmd = (FF + ["-f", "x11grab", "-draw_mouse", "0", "-framerate", str(FPS), "-video_size", f"{W}x{H}",
                     "-i", display, "-re", "-f", "lavfi", "-i", "sine=frequency=1000:sample_rate=48000",
                     "-t", str(total), "-map", "0:v", "-map", "1:a", "-c:v", "libx264"]
               + X264 + x264_rc(args.bitrate) + ["-c:a", "aac", "-b:a", "128k", "-f", "flv", url])
    else:
        cmd = [args.broadcast, "stream", url, "--record", rec, "--video", f"x11:{display}?cursor=off", "--audio-mic", "test",
               "--size", f"{W}x{H}", "--fps", str(FPS), "--preset", "veryfast", "--tune", "zerolatency",
               "--video-bitrate", args.bitrate, "--rate-control", "cbr", "--keyframe-interval", "2s",
               "--audio-bitrate", "128k", "--duration", f"{total}s", "-y"] + (["--adaptive"] if mode == "adaptive" else [])
    # nginx writes each frame into its recording as it arrives: the file's size over time gives
    # every packet's arrival at the server (its byte position in the file, matched to the size).
    growth, watching = [], threading.Event()

    def watch():
        sizes = {}
        while not watching.is_set():
            now = time.monotonic()
            for f in os.listdir(nginx.record_dir):
                if f.startswith(name + "-") or f == name + ".flv":
                    size = os.path.getsize(os.path.join(nginx.record_dir, f))
                    if sizes.get(f) != size:
                        sizes[f] = size
                        growth.append((now, f, size))
            watching.wait(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    child = PtyReader(cmd)
    try:
        if mode == "ffmpeg":
            # -re paces the input from its start: media time = wall time since then (less start-up).
            live = child.start
            while not proxy.connections and child.proc.poll() is None and time.monotonic() - child.start < 30:
                time.sleep(0.02)
            media_at = lambda t: t - child.start
        else:
            live = child.wait_for(": live", 60)
            if live is None:
                raise RuntimeError(f"{mode}: never went live: {child.lines[-20:]}")
            media_at = None
        time.sleep(max(0, args.before - (time.monotonic() - live)))
        dip_start_wall = time.monotonic()
        proxy.set_rate(args.low_kbit * 1000)
        time.sleep(args.dip)
        dip_end_wall = time.monotonic()
        proxy.set_rate(args.high_kbit * 1000)
        rc = child.wait(timeout=total + 180)
        end_wall = time.monotonic()
    finally:
        time.sleep(1)
        watching.set()
        watcher.join()
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()
        proxy.close()
    lines = child.lines
    # Media time at a wall moment: the status lines' time= (broadcast), interpolated.
    if media_at is None:
        stamps = []
        for t, line in lines:
            m = re.search(r"elapsed=\S+ frame=\d+ fps=\S+ time=(\d+:\d+:[\d.]+)", line)
            if m:
                stamps.append((t, clock_seconds(m.group(1))))

        def media_at(t, stamps=stamps):
            best = min(stamps, key=lambda s: abs(s[0] - t))
            return best[1] + (t - best[0])
    dip_start, dip_end = media_at(dip_start_wall), media_at(dip_end_wall)
    # Target bitrate: the notices; backlog: the status line.
    targets = []  # (media s, kbit/s)
    backlog = []  # (media s, ms)
    for t, line in lines:
        m = re.search(r"adapting: video at (\d+) of (\d+) kb/s", line)
        if m:
            targets.append((media_at(t), int(m.group(1)), int(m.group(2))))
        m = re.search(r"rtmp://\S+ live \d+kbit/s backlog=(\d+)ms", line)
        if m:
            backlog.append((media_at(t), int(m.group(1))))
    summary = next((line for _, line in reversed(lines) if line.startswith("broadcast: rtmp://")), "")
    rec_summary = next((line for _, line in reversed(lines) if line.startswith(f"broadcast: {rec}: ")), "")
    flvs = sorted(os.path.join(nginx.record_dir, f) for f in os.listdir(nginx.record_dir) if f.startswith(name))
    seconds = total + 2
    video = [p for f in flvs for p in packets(f)]
    frames, bits = per_second(video, seconds)
    # Arrival at the server, per wall second from the dip's start (second k = [k, k+1) s after it).
    arrivals = []
    for f in flvs:
        marks = [(t, size) for t, g, size in growth if g == os.path.basename(f)]
        for pts, size, pos in packets(f, with_pos=True):
            t = next((t for t, grown in marks if grown >= pos + size), None)
            if t is not None:
                arrivals.append((pts, t))
    late = [t - pts for pts, t in arrivals]
    base = min(late) if late else 0
    wall = {}
    for pts, t in arrivals:
        k = int((t - dip_start_wall) // 1)
        wall[k] = wall.get(k, 0) + 1
    result = {
        "mode": mode, "run": index, "exit": rc, "dip_start": dip_start, "dip_end": dip_end, "frames": frames,
        "video_kbit": [b // 1000 for b in bits], "targets": targets,
        "adapting": [f"{media_at(t):.2f} {line[line.index('adapting:'):]}" for t, line in lines if "adapting:" in line and "kb/s (" in line], "backlog": backlog, "publishes": len(flvs),
        "summary": summary, "rec_summary": rec_summary, "wall_past_media": end_wall - child.start - total,
        "proxy_connections": proxy.connections,
        "arrived_per_s": {k: wall.get(k, 0) for k in range(-args.before + 1, args.dip + args.after)},
        "late_max_ms": int(1000 * (max(late) - base)) if late else None,
        "late_during": [int(1000 * (max([t - pts for pts, t in arrivals if k <= t - dip_start_wall < k + 1] or [base]) - base))
                        for k in range(-args.before + 1, args.dip + args.after)],
    }
    m = re.search(r"max-backlog=(\d+)ms", summary)
    result["max_backlog_ms"] = int(m.group(1)) if m else None
    m = re.search(r"reconnects=(\d+)", summary)
    result["reconnects"] = int(m.group(1)) if m else max(0, proxy.connections - 1)
    m = re.search(r"drops=(\S+)", summary)
    result["drops"] = m.group(1).rstrip(";,") if m else None
    if mode != "ffmpeg":
        rv = packets(rec)
        rframes, rbits = per_second(rv, seconds)
        m = re.search(r": finished, (\d+) video", rec_summary)
        result.update({"rec_frames": len(rv), "rec_encoded": int(m.group(1)) if m else None,
                       "rec_kbit": [b // 1000 for b in rbits], "rec_frames_per_s": rframes})
        os.unlink(rec)
    for f in flvs:
        os.unlink(f)
    return result


def analyse(r, args):
    """The goal's figures for one run."""
    ds, de = r["dip_start"], r["dip_end"]
    total = args.before + args.dip + args.after
    full = r["frames"]
    # Whole media seconds from 3 s into the dip to the end (less the last, partial second).
    first, last = int(ds + 3) + 1, min(total - 1, len(full))
    window = full[first:last]
    dip_window = full[first:int(de)]
    # Arrivals at the server per wall second, from 3 s into the dip to the end of the run (less its
    # last second, which the run's end cuts short): the goal's "every second delivers >= 25 frames".
    arrived = [r["arrived_per_s"][k] for k in range(3, args.dip + args.after - 2)]
    in_dip = [r["arrived_per_s"][k] for k in range(3, args.dip)]
    out_arrived = {"arrived_min": min(arrived), "arrived_mean": sum(arrived) / len(arrived),
                   "arrived_under_25": sum(1 for f in arrived if f < 25),
                   "arrived_dip_min": min(in_dip), "arrived_dip_mean": sum(in_dip) / len(in_dip)}
    out = {"from_3s_min": min(window) if window else None,
           "from_3s_mean": sum(window) / len(window) if window else None,
           "dip_min": min(dip_window) if dip_window else None,
           "dip_mean": sum(dip_window) / len(dip_window) if dip_window else None,
           "seconds_under_25": sum(1 for f in window if f < 25), **out_arrived}
    maximum = int(args.bitrate.rstrip("Mk")) * (1000 if args.bitrate.endswith("M") else 1)
    if r["mode"] == "adaptive":
        # Target back to 80 %: the first notice after the dip's end at or above it.
        back = next((t for t, kb, _ in r["targets"] if t >= de and kb >= 0.8 * maximum), None)
        low = [kb for t, kb, _ in r["targets"] if ds <= t <= de]
        out["target_min_kbit"] = min(low) if low else None
        last_target = r["targets"][-1][1] if r["targets"] else maximum
        out["target_back_80_s"] = (back - de) if back is not None else (0.0 if last_target >= 0.8 * maximum and not any(
            t >= de for t, _, _ in r["targets"]) else None)
    # Delivered video bitrate back to 80 %: the first media second after the dip at >= 80 %.
    kb = r["video_kbit"]
    back = next((s for s in range(int(de) + 1, len(kb) - 1) if kb[s] >= 0.8 * maximum), None)
    out["delivered_back_80_s"] = (back - de) if back is not None else None
    out["backlog_max_ms"] = r["max_backlog_ms"] if r["max_backlog_ms"] is not None else (
        max(b for _, b in r["backlog"]) if r["backlog"] else None)
    if "rec_frames" in r:
        rk = r["rec_kbit"][1:total - 1]
        out["rec"] = {"frames": r["rec_frames"], "encoded": r["rec_encoded"],
                      "kbit_mean": sum(rk) / len(rk) if rk else None,
                      "kbit_dip_min": min(r["rec_kbit"][int(ds) + 1:int(de)]) if de - ds > 2 else None,
                      "frames_per_s_min": min(r["rec_frames_per_s"][1:total - 1])}
    return out


def markdown(results, args, info):
    total = args.before + args.dip + args.after
    lines = [f"Machine: {info['nproc']} cores, {info['cpu']}; {info['ffmpeg']}; load average at start: "
             f"{info['load_at_start']}. Path {args.high_kbit} kbit/s, {args.low_kbit} kbit/s from {args.before} s "
             f"for {args.dip} s, then {args.high_kbit} kbit/s; {W}x{H}p{FPS} at {args.bitrate} CBR, veryfast, "
             f"zerolatency, AAC 128k.", "",
             "| run | frames/s arriving at the server from 3 s into the dip: min / mean (seconds < 25) | in the dip only: "
             "min / mean | media seconds with < 25 frames (pts) from 3 s into the dip | backlog max ms "
             "| late at the server, max ms | target min kbit/s | target back to 80 % | delivered back to 80 % "
             "| reconnects | drops | recording: frames / encoded, kbit/s mean, min in the dip |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        a = r["analysis"]
        f = lambda v, spec=".1f": "—" if v is None else format(v, spec)
        rec = a.get("rec")
        rec_cell = (f"{rec['frames']} / {rec['encoded']}, {f(rec['kbit_mean'], '.0f')}, {f(rec['kbit_dip_min'], '.0f')}"
                    if rec else "—")
        backlog = f(a["backlog_max_ms"], "d") if r["mode"] != "ffmpeg" else f"(ends {r['wall_past_media']:.1f} s late)"
        lines.append(f"| {r['mode']} {r['run']} | {a['arrived_min']} / {a['arrived_mean']:.1f} ({a['arrived_under_25']}) "
                     f"| {a['arrived_dip_min']} / {a['arrived_dip_mean']:.1f} | {a['seconds_under_25']} (min {f(a['from_3s_min'], 'd')}) "
                     f"| {backlog} | {f(r['late_max_ms'], 'd')} | {f(a.get('target_min_kbit'), 'd')} "
                     f"| {f(a.get('target_back_80_s'))} s | {f(a['delivered_back_80_s'])} s | {r['reconnects']} "
                     f"| {r['drops'] or '—'} | {rec_cell} |")
    lines += ["", "Frames arriving at the server per wall second (from the dip's start: [ ] is the dip), and how late "
              "the latest of them was (ms, against the earliest packet's lateness):", ""]
    for r in results:
        ks = range(-args.before + 1, args.dip + args.after)
        lines.append(f"- {r['mode']} {r['run']}: " + " ".join(
            ("[" if k == 0 else "") + str(r["arrived_per_s"][k]) + ("]" if k == args.dip - 1 else "") for k in ks))
        lines.append("  late ms: " + " ".join(str(v) for v in r["late_during"]))
    lines += ["", "Frames the server got per second of media (dip marked [ ]), and the delivered video kbit/s:", ""]
    for r in results:
        ds, de = r["dip_start"], r["dip_end"]
        cells = []
        for s in range(1, total):
            mark = "[" if s == int(ds) + 1 else ""
            end = "]" if s == int(de) else ""
            cells.append(f"{mark}{r['frames'][s]}{end}")
        lines.append(f"- {r['mode']} {r['run']} (dip {ds:.1f}–{de:.1f} s): " + " ".join(cells))
        lines.append(f"  kbit/s: " + " ".join(str(k) for k in r["video_kbit"][1:total]))
        if r["targets"]:
            lines.append("  target: " + ", ".join(f"{t:.1f} s {kb}" for t, kb, _ in r["targets"]))
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--broadcast", required=True)
    p.add_argument("--runs", type=int, default=1, help="runs per mode, alternating")
    p.add_argument("--modes", default="adaptive,fixed,ffmpeg")
    p.add_argument("--bitrate", default="3M")
    p.add_argument("--high-kbit", type=int, default=6000)
    p.add_argument("--low-kbit", type=int, default=1200)
    p.add_argument("--before", type=int, default=10)
    p.add_argument("--dip", type=int, default=20)
    p.add_argument("--after", type=int, default=25)
    p.add_argument("--out", default="out/dip")
    args = p.parse_args()
    args.broadcast = os.path.abspath(args.broadcast)
    os.makedirs(args.out, exist_ok=True)
    info = machine()
    print(f"machine: {info}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="broadcast-dip-") as work:
        nginx = Nginx(work, record=True)
        # The picture: an X11 screen (Xvfb) with ffplay showing testsrc2 over all of it (bench.py's
        # "full" screen): moving colour everywhere, so the stream needs its 3 Mbit/s. broadcast's
        # test pattern would not (flat bars: ~200 kbit/s, and an adaptive stream's encode pads
        # nothing: no nal-hrd=cbr filler), so the dip would never touch it.
        bench.SCREEN_SIZE = (W, H)
        screen = XScreen("full")
        screen.start()
        try:
            for i in range(args.runs):
                for mode in args.modes.split(","):
                    print(f"{mode} run {i + 1}/{args.runs} ...", flush=True)
                    r = run_one(args, mode, work, nginx, screen.display, i + 1)
                    r["analysis"] = analyse(r, args)
                    print(f"  {json.dumps(r['analysis'])}\n  {r['summary']}\n  {r['rec_summary']}", flush=True)
                    results.append(r)
        finally:
            screen.stop()
            nginx.stop()
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"machine": info, "results": results}, f, indent=1)
    table = markdown(results, args, info)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)
    print()
    print(table)


if __name__ == "__main__":
    sys.exit(main())
