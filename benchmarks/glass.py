#!/usr/bin/env python3
"""Glass-to-glass latency: broadcast's X11 source vs ffmpeg -f x11grab, each published to nginx-rtmp on
loopback (one at a time) and read back by one low-delay ffmpeg reader that decodes a barcode of the clock.

An X client (benchmarks/glass/painter.c, built here with cc) paints CLOCK_MONOTONIC as a barcode on a
1280x720 Xvfb screen ~250 times a second. The reader (ffmpeg -fflags nobuffer -flags low_delay,
one decoding thread, raw grey frames of the barcode band to a pipe, flushed per frame) stamps each
frame as it arrives; latency = arrival - painted time. The floor is the same reader grabbing the
screen itself (x11grab, no encoder, no network). Both publishers use x264 veryfast + zerolatency,
CBR 3 Mb/s, a keyframe every 2 s, no audio. Runs alternate broadcast, ffmpeg, floor.

The reader's socket ACKs late: nginx-rtmp never sets TCP_NODELAY, so while the reader holds back its
ACK of one frame (Linux's delayed ACK, 40 ms at least), Nagle keeps the next frame in nginx's socket:
that frame arrives ~40 ms late and the one after it right behind (a 75-80 ms gap, then < 1 ms at
30 fps), whoever publishes. That is the rig, not the publisher. So the runs are made twice: as is
("default ACKs"), and in a private network namespace whose loopback route has `quickack 1` (the
receivers ACK at once; nothing outside this benchmark is changed), which shows the publishers' own
latency. Needs root, unshare and ip for the second; skipped otherwise.

Usage: benchmarks/glass.py --broadcast PATH [--broadcast-before PATH] [--fps 30,60] [--runs 3]
                           [--seconds 20] [--rigs default,quickack] [--stages] [--out DIR]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Nginx, machine  # noqa: E402

W, H = 1280, 720
BITS, BAR, BAND_H = 32, 16, 96  # as in painter.c
PAINT_RATE = 250
BITRATE = "3M"
FF = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error"]
WARMUP_S = 3.0


def build_painter(work):
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "glass", "painter.c")
    exe = os.path.join(work, "painter")
    compiler = shutil.which("cc") or shutil.which("clang") or "gcc"
    subprocess.run([compiler, "-O2", "-o", exe, src, "-lxcb"], check=True)
    return exe


def start_xvfb():
    n = 300 + os.getpid() % 200
    while os.path.exists(f"/tmp/.X11-unix/X{n}") or os.path.exists(f"/tmp/.X{n}-lock"):
        n += 1
    proc = subprocess.Popen(["Xvfb", f":{n}", "-screen", "0", f"{W}x{H}x24", "-nolisten", "tcp", "-noreset"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(f"/tmp/.X11-unix/X{n}"):
            break
        time.sleep(0.05)
    return proc, f":{n}"


def decode(band):
    """The painted time (100 µs units mod 2^32) in one grey band, or None when it does not read cleanly
    (a frame captured between the painter's two fills, or damaged by the encoder)."""
    x0 = (W - 2 * BITS * BAR) // 2
    row = (BAND_H // 2) * W
    value = 0
    for i in range(BITS):
        a_x = x0 + 2 * i * BAR + BAR // 2
        b_x = a_x + BAR
        a = sum(band[row + a_x - 3: row + a_x + 4]) / 7
        b = sum(band[row + b_x - 3: row + b_x + 4]) / 7
        if a < 96 and b > 160:
            bit = 1
        elif a > 160 and b < 96:
            bit = 0
        else:
            return None
        value = (value << 1) | bit
    return value


class Reader:
    """ffmpeg decoding `source` to raw grey bands on a pipe; a thread stamps each band on arrival."""

    def __init__(self, input_args):
        frame = W * BAND_H
        self.samples = []  # (arrival monotonic ns, latency ms)
        self.unreadable = 0
        self.proc = subprocess.Popen(
            FF + ["-fflags", "nobuffer", "-flags", "low_delay", "-threads", "1"] + input_args
            + ["-an", "-vf", f"crop={W}:{BAND_H}:0:0,format=gray", "-fps_mode", "passthrough",
               "-flush_packets", "1", "-f", "rawvideo", "pipe:1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        self.started = time.monotonic_ns()

        def run():
            seen = set()
            buf = bytearray()
            while True:
                chunk = self.proc.stdout.read(frame - len(buf))
                if not chunk:
                    return
                buf += chunk
                if len(buf) < frame:
                    continue
                now = time.monotonic_ns()
                value = decode(buf)
                buf_copy = bytes(buf)
                buf = bytearray()
                if value is None:
                    self.unreadable += 1
                    if os.environ.get("GLASS_DEBUG") and self.unreadable == 50:
                        with open("/tmp/glass-bad.gray", "wb") as f:
                            f.write(buf_copy)
                    continue
                if value in seen:
                    continue
                seen.add(value)
                latency_units = ((now // 100_000) - value) % (1 << 32)
                self.samples.append((now, latency_units / 10.0 + (now % 100_000) / 1e6))

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.thread.join(timeout=5)
        if os.environ.get("GLASS_DEBUG"):
            print(f"    reader: {len(self.samples)} read, {self.unreadable} unreadable; "
                  f"{self.proc.stderr.read().decode(errors='replace')[-800:]}", flush=True)
        first = self.samples[0][0] if self.samples else 0
        return [s for s in self.samples if s[0] - first > WARMUP_S * 1e9]

    def collect(self, seconds):
        """Waits for the first frame (at most 30 s), then for the warm-up and `seconds` more."""
        deadline = time.monotonic() + 30
        while not self.samples and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        time.sleep(WARMUP_S + seconds)


class WHIPReader:
    """The WebRTC viewer: scripts/whip-endpoint.py (aiortc, decoding with FFmpeg) as the WHIP endpoint
    broadcast publishes to, writing each decoded frame's barcode band, stamped as decoded, to a FIFO."""

    def __init__(self, args, port):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.fifo = os.path.join(args.work, f"band-{port}")
        os.mkfifo(self.fifo)
        self.samples = []
        self.unreadable = 0
        self.proc = subprocess.Popen(
            [args.whip_python, os.path.join(root, "scripts", "whip-endpoint.py"), "--port", str(port),
             "--band-out", self.fifo, "--band-rows", str(BAND_H)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

        def run():
            seen = set()
            record = 8 + W * BAND_H
            with open(self.fifo, "rb", buffering=0) as f:
                buf = bytearray()
                while True:
                    chunk = f.read(record - len(buf))
                    if not chunk:
                        return
                    buf += chunk
                    if len(buf) < record:
                        continue
                    now = int.from_bytes(buf[:8], "little")
                    value = decode(bytes(buf[8:]))
                    buf = bytearray()
                    if value is None:
                        self.unreadable += 1
                        continue
                    if value in seen:
                        continue
                    seen.add(value)
                    latency_units = ((now // 100_000) - value) % (1 << 32)
                    self.samples.append((now, latency_units / 10.0 + (now % 100_000) / 1e6))

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()  # opens the FIFO, which the endpoint waits for before it listens
        self.proc.stdout.readline()  # "listening"

    collect = Reader.collect

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.thread.join(timeout=5)
        first = self.samples[0][0] if self.samples else 0
        return [s for s in self.samples if s[0] - first > WARMUP_S * 1e9]


def publisher(side, args, display, url, fps):
    if side.startswith("broadcast"):
        exe = args.broadcast_before if side == "broadcast-before" else args.broadcast
        # "broadcast+a21ms": with the test tone in 21 ms periods as the microphone (what audio costs video).
        audio = f"test:period={side.split('+a', 1)[1]}" if "+a" in side else "none"
        return [exe, "stream", url, "--video", f"x11:{display}?cursor=off", "--audio-mic", audio,
                "--fps", str(fps), "--preset", "veryfast", "--tune", "zerolatency", "--video-bitrate", BITRATE,
                "--rate-control", "cbr", "--keyframe-interval", "2s", "--quiet", "--log-level", "error"]
    # "ffmpeg+a": with a sine as its audio (AAC) read in real time (-re) in 1024-sample (21 ms) frames, as a device delivers it.
    audio_in = ["-re", "-f", "lavfi", "-i", "sine=f=1000:r=48000:samples_per_frame=1024"] if "+a" in side else []
    audio_out = ["-c:a", "aac", "-b:a", "128k"] if "+a" in side else ["-an"]
    return FF + ["-f", "x11grab", "-draw_mouse", "0", "-framerate", str(fps), "-video_size", f"{W}x{H}",
                 "-i", display] + audio_in + audio_out + ["-c:v", "libx264", "-preset", "veryfast", "-tune", "zerolatency",
                 "-forced-idr", "1", "-b:v", BITRATE, "-minrate", BITRATE, "-maxrate", BITRATE, "-bufsize", BITRATE,
                 "-x264-params", "nal-hrd=cbr", "-g", str(2 * fps), "-pix_fmt", "yuv420p", "-f", "flv", url]


def run_one(side, args, display, nginx, fps, index, env):
    if side == "floor":
        reader = Reader(["-f", "x11grab", "-draw_mouse", "0", "-framerate", str(fps),
                         "-video_size", f"{W}x{BAND_H}", "-i", f"{display}+0,0"])
        reader.collect(args.seconds)
        return reader.stop(), None
    url = f"{nginx.url}/{side.replace('+', '-')}{fps}x{index}"
    whip = None
    if side == "broadcast-whip":
        port = nginx.port + 1000 + index
        whip = WHIPReader(args, port)
        url = f"whip+http://127.0.0.1:{port}/whip/glass{fps}x{index}"
    pub_env = dict(env)
    stages = None
    if side.startswith("broadcast") and args.stages:
        stages = os.path.join(args.work, f"stages-{side}-{fps}-{index}.tsv")
        pub_env["BROADCAST_STAGES_FILE"] = stages
        pub_env["BROADCAST_LATENCY_FILE"] = stages + ".latency.json"  # the session's stages ride on the latency probe
    pub = subprocess.Popen(publisher(side, args, display, url, fps), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=pub_env)
    time.sleep(1.0)
    # With audio in the stream FLV's streams appear as their packets do: probe long enough to see video.
    reader = whip or Reader(["-analyzeduration", "3000000" if "+a" in side else "500000", "-i", url])
    reader.collect(args.seconds)
    samples = reader.stop()
    pub.send_signal(signal.SIGINT)
    try:
        _, err = pub.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        pub.kill()
        _, err = pub.communicate()
    if not samples:
        print(f"  {side}: no frames read; publisher said: {err.decode(errors='replace')[-1500:]}", flush=True)
    return samples, stages


def stage_summary(prefix):
    """Per-stage p50/p99/max (ms) from broadcast's BROADCAST_STAGES_FILE logs (`prefix`.session/.output.tsv)."""
    def load(path):
        with open(path) as f:
            rows = [line.rstrip("\n").split("\t") for line in f]
        return {int(r[0]): dict(zip(rows[0], map(int, r))) for r in rows[1:] if r and r[0]}
    try:
        session, output = load(prefix + ".session.tsv"), load(prefix + ".output.tsv")
    except OSError:
        return None
    spans = {"capture → handler": ("captured", "handler_in"), "handler → encoder (conversion)": ("handler_in", "encoder_in"),
             "encoder": ("encoder_in", "encoder_out"), "queue → output thread": ("encoder_out", "popped"),
             "output thread → socket written": ("popped", "written"), "capture → socket written": ("captured", "written")}
    out = {}
    for name, (a, b) in spans.items():
        values = sorted((({**session[p], **output[p]})[b] - ({**session[p], **output[p]})[a]) / 1e6
                        for p in session if p in output and session[p].get("encoder_in") and output[p].get("popped"))
        out[name] = {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99),
                     "max": values[-1] if values else float("nan")}
    return out


def percentile(sorted_values, p):
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, int(round(p * (len(sorted_values) - 1))))
    return sorted_values[i]


def summarize(samples, fps):
    lat = sorted(s[1] for s in samples)
    arrivals = sorted(s[0] for s in samples)
    gaps = [(b - a) / 1e6 for a, b in zip(arrivals, arrivals[1:])]
    period = 1000.0 / fps
    # The signature of a frame held back and released with the next: a long gap, then a very short one.
    held = sum(1 for g, h in zip(gaps, gaps[1:]) if g > 1.8 * period and h < 0.3 * period)
    return {"held": held, "held_share": held / len(gaps) if gaps else float("nan"),"frames": len(lat), "p50": percentile(lat, 0.5), "p90": percentile(lat, 0.9),
            "p99": percentile(lat, 0.99), "max": lat[-1] if lat else float("nan"),
            "long_gaps": sum(1 for g in gaps if g > 1.8 * period),
            "long_gap_share": (sum(1 for g in gaps if g > 1.8 * period) / len(gaps)) if gaps else float("nan")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--broadcast", required=True)
    p.add_argument("--broadcast-before", help="another broadcast binary to run side by side (before a fix)")
    p.add_argument("--fps", default="30,60")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--stages", action="store_true", help="also have broadcast write per-stage timestamps")
    p.add_argument("--audio-periods", default="", help="e.g. 10ms,21ms: also run broadcast with the test tone as its "
                   "microphone in periods of that length (a video frame waits for the audio period it falls in)")
    p.add_argument("--out", default="out/glass")
    p.add_argument("--whip", action="store_true", help="also broadcast through WHIP (WebRTC) to an aiortc viewer "
                   "(scripts/whip-endpoint.py), beside RTMP")
    p.add_argument("--whip-python", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   ".build", "whip-venv", "bin", "python"), help="a python with aiortc and aiohttp (the tests' virtualenv)")
    p.add_argument("--rigs", default="default,quickack", help="default: loopback as it is; quickack: a private "
                   "network namespace whose loopback ACKs at once")
    p.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    rigs = args.rigs.split(",")
    args.broadcast = os.path.abspath(args.broadcast)
    if args.broadcast_before:
        args.broadcast_before = os.path.abspath(args.broadcast_before)
    os.makedirs(args.out, exist_ok=True)
    tables = []
    if "default" in rigs or args.in_netns:
        tables.append(("quick ACKs (private network namespace, loopback route quickack 1)" if args.in_netns
                       else "default ACKs", run_rig(args)))
    if "quickack" in rigs and not args.in_netns:
        if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
            print("quickack rig: skipped (needs root, unshare and ip)")
        else:
            sub = os.path.join(args.out, "quickack")
            setup = ("ip link set lo up && "
                     "ip route change table local local 127.0.0.0/8 dev lo proto kernel scope host src 127.0.0.1 quickack 1 && "
                     "ip route change table local local 127.0.0.1 dev lo proto kernel scope host src 127.0.0.1 quickack 1 && "
                     'exec "$@"')
            cmd = ["unshare", "-n", "sh", "-c", setup, "sh", sys.executable, os.path.abspath(__file__),
                   "--broadcast", args.broadcast, "--fps", args.fps, "--runs", str(args.runs),
                   "--seconds", str(args.seconds), "--out", sub, "--in-netns", "--audio-periods", args.audio_periods]
            if args.broadcast_before:
                cmd += ["--broadcast-before", args.broadcast_before]
            if args.stages:
                cmd += ["--stages"]
            if args.whip:
                cmd += ["--whip", "--whip-python", args.whip_python]
            subprocess.run(cmd, check=True)
            with open(os.path.join(sub, "glass.md")) as f:
                tables.append(("quick ACKs (private network namespace, loopback route quickack 1)", f.read()))
    if not args.in_netns:
        text = "".join(f"{title}:\n\n{table}\n" for title, table in tables)
        with open(os.path.join(args.out, "glass-all.md"), "w") as f:
            f.write(text)
        print()
        print(text)


def run_rig(args):
    info = machine()
    results = {}
    stage_rows = {}
    with tempfile.TemporaryDirectory(prefix="broadcast-glass-") as work:
        args.work = work
        painter_exe = build_painter(work)
        xvfb, display = start_xvfb()
        env = dict(os.environ, DISPLAY=display)
        painter = subprocess.Popen([painter_exe, str(W), str(H), str(PAINT_RATE)], env=env)
        nginx = Nginx(work)
        try:
            time.sleep(1)
            for fps in [int(f) for f in args.fps.split(",")]:
                sides = ((["broadcast-before"] if args.broadcast_before else []) + ["broadcast"]
                         + (["broadcast-whip"] if args.whip else [])
                         + [f"broadcast+a{p}" for p in args.audio_periods.split(",") if p] + ["ffmpeg"]
                         + (["ffmpeg+a"] if args.audio_periods else []) + ["floor"])
                got = {side: [] for side in sides}
                for i in range(args.runs):
                    for side in sides:
                        samples, stages = run_one(side, args, display, nginx, fps, i, env)
                        got[side] += samples
                        s = summarize(samples, fps)
                        print(f"  {fps} fps run {i + 1}/{args.runs} {side:9}: {s['frames']} frames, p50 {s['p50']:.1f} "
                              f"p90 {s['p90']:.1f} p99 {s['p99']:.1f} max {s['max']:.1f} ms, "
                              f"{s['long_gaps']} gaps > 1.8 periods, {s['held']} held and released with the next", flush=True)
                        if stages:
                            st = stage_summary(stages)
                            if st:
                                stage_rows.setdefault(fps, []).append(st)
                                print("    stages: " + ", ".join(f"{k} {v['p50']:.1f}/{v['p99']:.1f}/{v['max']:.1f}"
                                                          for k, v in st.items()) + " ms (p50/p99/max)", flush=True)
                        for part in ("session", "output"):
                            if stages and os.path.exists(f"{stages}.{part}.tsv"):
                                shutil.copy(f"{stages}.{part}.tsv", args.out)
                        if True:
                            keep = [s for s in samples]
                            with open(os.path.join(args.out, f"arrivals-{side}-{fps}-{i}.tsv"), "w") as g:
                                g.write("arrival\tlatency_ms\n")
                                for a, l in keep:
                                    g.write(f"{a}\t{l:.3f}\n")
                results[fps] = {side: summarize(v, fps) for side, v in got.items()}
        finally:
            nginx.stop()
            painter.kill()
            painter.wait()
            xvfb.kill()
            xvfb.wait()
    lines = [f"Machine: {info['nproc']} cores, {info['cpu']}; {info['ffmpeg']}. Load at start: {info['load_at_start']}. "
             f"{args.runs} alternating runs of {args.seconds:.0f} s per side and rate.", "",
             "| fps | who | frames | p50 ms | p90 | p99 | max | arrival gaps > 1.8 periods | held, released with the next |",
             "|---|---|---|---|---|---|---|---|---|"]
    for fps, r in results.items():
        labelled = ([("broadcast-before", "broadcast (before)"), ("broadcast", "broadcast (RTMP, ffmpeg reader)"),
                     ("broadcast-whip", "broadcast (WHIP, aiortc viewer)")]
                    + [(side, f"broadcast + tone in {side.split('+a', 1)[1]} periods") for side in r if side.startswith("broadcast+a")]
                    + [("ffmpeg", "ffmpeg x11grab"), ("ffmpeg+a", "ffmpeg x11grab + sine (AAC)"),
                       ("floor", "floor (reader grabs the screen)")])
        for side, label in labelled:
            if side not in r:
                continue
            s = r[side]
            lines.append(f"| {fps} | {label} | {s['frames']} | {s['p50']:.1f} | {s['p90']:.1f} | {s['p99']:.1f} "
                         f"| {s['max']:.1f} | {100 * s['long_gap_share']:.1f} % | {100 * s['held_share']:.1f} % |")
    for fps, runs in stage_rows.items():
        lines += ["", f"broadcast's stages at {fps} fps (ms, p50 / p99 / max, worst run by p99 of the total):", "",
                  "| stage | p50 | p99 | max |", "|---|---|---|---|"]
        worst = max(runs, key=lambda r: r["capture → socket written"]["p99"])
        for k, v in worst.items():
            lines.append(f"| {k} | {v['p50']:.1f} | {v['p99']:.1f} | {v['max']:.1f} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "glass.json"), "w") as f:
        json.dump({"machine": info, "results": results}, f, indent=1)
    with open(os.path.join(args.out, "glass.md"), "w") as f:
        f.write(table)
    return table


if __name__ == "__main__":
    sys.exit(main())
