#!/usr/bin/env python3
"""broadcast side by side with ffmpeg on the same jobs, in the same run.

Each case runs broadcast (A) and the equivalent ffmpeg command line (B) alternately, A B A B ...,
for --pairs pairs, and reports the median of the per-pair ratios (A/B) with the absolute medians.
Figures are whole-process: user+sys CPU and peak RSS of the child from os.wait4 (getrusage), peak
private dirty memory (Private_Dirty of /proc/PID/smaps_rollup, sampled every 100 ms while it runs:
the footprint broadcast's --memory-budget holds, without shared library pages), wall time from a
monotonic clock. Nothing here is a pass/fail threshold: this reports, it does not judge.

Usage: benchmarks/bench.py --broadcast PATH [--pairs 3] [--seconds 8] [--offline-seconds 60]
                           [--cases rec-720,rec-1080,...] [--out DIR] [--markdown FILE]
"""

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

X264 = ["-preset", "veryfast", "-tune", "zerolatency", "-forced-idr", "1"]
SIZES = {"720": (1280, 720, "4M"), "1080": (1920, 1080, "6M")}
FPS = 30


def run_measured(cmd, env=None, timeout=None):
    """Runs cmd; returns wall seconds, user+sys CPU seconds, peak RSS (MB) of that process."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env)
    # Read stderr on the side so a chatty child cannot block on a full pipe.
    err = []
    import threading
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()))
    reader.start()
    dirty = [0]
    done = threading.Event()

    def sample():
        # Private_Dirty in kB; the process may end between two reads.
        while not done.is_set():
            try:
                with open(f"/proc/{proc.pid}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Private_Dirty:"):
                            dirty[0] = max(dirty[0], int(line.split()[1]))
            except (OSError, ValueError):
                pass
            done.wait(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    done.set()
    sampler.join()
    reader.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = (err[0] if err else b"").decode(errors="replace")[-2000:]
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n{tail}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "user": usage.ru_utime,
            "sys": usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024.0, "dirty_mb": dirty[0] / 1024.0}


def x264_rc(bitrate):
    return ["-b:v", bitrate, "-minrate", bitrate, "-maxrate", bitrate, "-bufsize", bitrate,
            "-x264-params", "nal-hrd=cbr", "-g", str(2 * FPS), "-pix_fmt", "yuv420p"]


def ffmpeg_inputs(w, h, realtime):
    re_flag = ["-re"] if realtime else []
    return (re_flag + ["-f", "lavfi", "-i", f"testsrc2=size={w}x{h}:rate={FPS}"]
            + re_flag + ["-f", "lavfi", "-i", "sine=frequency=1000:sample_rate=48000"])


def ffmpeg_same_inputs(pattern, w, h, realtime):
    """broadcast's own test pattern and tone, decoded losslessly to raw files, looped: the same
    pictures and sound for x264 and AAC as broadcast encodes, read as cheaply as ffmpeg can."""
    re_flag = ["-re"] if realtime else []
    return (re_flag + ["-stream_loop", "-1", "-f", "rawvideo", "-pix_fmt", "yuv420p", "-s", f"{w}x{h}",
                       "-r", str(FPS), "-i", pattern["video"]]
            + re_flag + ["-stream_loop", "-1", "-f", "s16le", "-ar", "48000", "-ac", "2", "-i", pattern["audio"]])


def make_pattern(broadcast, work, key, w, h):
    """Records 4 s of broadcast's test sources losslessly (x264 qp 0, the block's full cycle) and
    decodes them to raw yuv420p and s16le files."""
    mkv = os.path.join(work, f"pattern-{key}.mkv")
    subprocess.run([broadcast, "record", mkv, "-y", "--video", "test", "--audio-mic", "test", "--size", f"{w}x{h}",
                    "--fps", str(FPS), "--duration", "4s", "--no-realtime", "--rate-control", "crf", "--crf", "0",
                    "--video-bitrate", "500M", "--preset", "ultrafast", "--audio-bitrate", "320k", "--quiet",
                    # Lossless 500M sizes the queues past the default budget (720p asks 167.5 MiB).
                    "--memory-budget", "1G",
                    "--log-level", "error"], check=True)
    out = {"video": os.path.join(work, f"pattern-{key}.yuv"), "audio": os.path.join(work, f"pattern-{key}.s16")}
    subprocess.run(FF + ["-i", mkv, "-map", "0:v", "-f", "rawvideo", "-pix_fmt", "yuv420p", out["video"],
                         "-map", "0:a", "-f", "s16le", "-ac", "2", "-ar", "48000", out["audio"]], check=True)
    os.unlink(mkv)
    return out


def ffmpeg_encode(w, h, bitrate, seconds):
    return (["-t", str(seconds), "-map", "0:v", "-map", "1:a", "-c:v", "libx264"] + X264 + x264_rc(bitrate)
            + ["-c:a", "aac", "-b:a", "128k", "-ac", "2", "-ar", "48000"])


def broadcast_encode(w, h, bitrate, seconds, realtime):
    return (["--video", "test", "--audio-mic", "test", "--size", f"{w}x{h}", "--fps", str(FPS),
             "--duration", f"{seconds}s", "--preset", "veryfast", "--tune", "zerolatency",
             "--video-bitrate", bitrate, "--rate-control", "cbr", "--keyframe-interval", "2s",
             "--audio-bitrate", "128k", "--quiet", "--log-level", "error", "-y"]
            + ([] if realtime else ["--no-realtime"]))


FF = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y"]


class Case:
    """One job: broadcast's command, ffmpeg's, how much media each makes."""

    def __init__(self, name, title, a, b, media_seconds, frames, realtime, latency=False, needs_stream=False,
                 screen=None, outputs=None):
        self.name, self.title, self.a, self.b = name, title, a, b
        self.media_seconds, self.frames, self.realtime = media_seconds, frames, realtime
        self.latency, self.needs_stream = latency, needs_stream
        # An X screen the case records (started before its pairs, stopped after), and the files
        # the two sides write (their x264 option strings are compared).
        self.screen, self.outputs = screen, outputs


# X11 screen capture: broadcast --video x11: vs ffmpeg -f x11grab, the same Xvfb screen, 1080p30, the
# same x264 settings (checked: both files' x264 option strings, from the SEI x264 writes, are printed
# and compared). Three screens: "full" (a video over the whole screen: ffplay showing testsrc2 at
# 1920x1080, so the whole screen is redrawn every frame), "desktop" (static windows, xclock ticking
# every second, a 240x240 animation: ffplay showing testsrc2 at 240x240), "static" (static windows).
SCREEN_SIZE = (1920, 1080)


class XScreen:
    """An Xvfb display with one of the benchmark screens on it; started and stopped by PID."""

    def __init__(self, kind):
        self.kind, self.procs, self.server = kind, [], None

    def start(self):
        n = 400 + os.getpid() % 50
        while os.path.exists(f"/tmp/.X11-unix/X{n}") or os.path.exists(f"/tmp/.X{n}-lock"):
            n += 1
        self.display = f":{n}"
        w, h = SCREEN_SIZE
        self.server = subprocess.Popen(["Xvfb", self.display, "-screen", "0", f"{w}x{h}x24", "-nolisten", "tcp",
                                        "-noreset"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            if os.path.exists(f"/tmp/.X11-unix/X{n}"):
                break
            time.sleep(0.05)
        env = dict(os.environ, DISPLAY=self.display, SDL_AUDIODRIVER="dummy")

        def client(*cmd):
            self.procs.append(subprocess.Popen(list(cmd), env=env, stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def video(x, y, vw, vh):
            client("ffplay", "-loglevel", "quiet", "-an", "-noborder", "-left", str(x), "-top", str(y), "-x", str(vw),
                   "-y", str(vh), "-f", "lavfi", "-i", f"testsrc2=size={vw}x{vh}:rate={FPS}")

        if self.kind == "full":
            video(0, 0, w, h)
        else:
            for colour, x, y, ww, wh in (("red", 0, 0, 960, 540), ("navy", 960, 0, 960, 540),
                                         ("gray", 0, 540, 1300, 540), ("darkgreen", 1300, 540, 620, 540)):
                client("xlogo", "-bw", "0", "-bg", colour, "-fg", "white", "-geometry", f"{ww}x{wh}+{x}+{y}")
            if self.kind == "desktop":
                client("xclock", "-update", "1", "-geometry", "200x200+1600+60")
                video(200, 700, 240, 240)
        time.sleep(2)

    def stop(self):
        for proc in self.procs + ([self.server] if self.server else []):
            proc.kill()
            proc.wait()
        self.procs, self.server = [], None
        n = self.display[1:]
        for path in (f"/tmp/.X{n}-lock", f"/tmp/.X11-unix/X{n}"):
            if os.path.exists(path):
                os.unlink(path)


def x264_options(path):
    """The option string x264 writes into its first SEI ("... options: cabac=1 ref=1 ..."), or None."""
    with open(path, "rb") as f:
        data = f.read(4 << 20)
    m = re.search(rb"x264 - core .*? - options: (.*?)\x00", data, re.S)
    return m.group(1).decode(errors="replace") if m else None


def screen_cases(args, work):
    cases = []
    w, h = SCREEN_SIZE
    s = args.seconds
    rate = "6M"
    for kind, mode in (("full", "cfr"), ("desktop", "cfr"), ("static", "cfr"), ("desktop", "vfr"), ("static", "vfr")):
        name = f"screen-{kind}" + ("-vfr" if mode == "vfr" else "")
        if not wanted(args, name):
            continue
        screen = XScreen(kind)
        a_out, b_out = os.path.join(work, f"{name}-a.mp4"), os.path.join(work, f"{name}-b.mp4")
        cases.append(Case(
            name, f"x11 {kind} screen 1080p30 {mode} → mp4",
            lambda sc=screen, o=a_out, m=mode: [args.broadcast, "record", o, "--video", f"x11:{sc.display}?cursor=off",
                                                "--audio-mic", "none", "--fps", str(FPS), "--duration", f"{s}s",
                                                "--preset", "veryfast", "--tune", "zerolatency", "--video-bitrate", rate,
                                                "--rate-control", "cbr", "--keyframe-interval", "2s",
                                                "--frame-rate-mode", m, "--quiet", "--log-level", "error", "-y"],
            lambda sc=screen, o=b_out: FF + ["-f", "x11grab", "-draw_mouse", "0", "-framerate", str(FPS),
                                             "-video_size", f"{w}x{h}", "-i", sc.display, "-t", str(s), "-an",
                                             "-c:v", "libx264"] + X264 + x264_rc(rate) + ["-movflags", "+faststart", o],
            s, s * FPS, True, latency=True, screen=screen, outputs=(a_out, b_out)))
    return cases


# Composition (issue 26): the X11 screen of 1080p30 with a 640x360 moving layer in its bottom-right
# corner, against ffmpeg's x11grab with the same layer put on by `overlay`. The layer is the same
# moving picture on both sides: broadcast's test pattern painted at 640x360 (its `test` layer), and
# for ffmpeg that pattern recorded losslessly and looped from a raw file (`make_pattern`). Two
# screens under it: "full" (the whole screen moving) and "static" (static windows: broadcast redraws
# only the layer's box, ffmpeg's overlay redraws the frame).
LAYER_SIZE = (640, 360)


def layer_cases(args, work, layer_pattern):
    cases = []
    w, h = SCREEN_SIZE
    lw, lh = LAYER_SIZE
    x, y = w - lw, h - lh
    s = args.seconds
    rate = "6M"
    for kind in ("full", "static"):
        name = f"layer-{'moving' if kind == 'full' else 'static'}"
        if not wanted(args, name):
            continue
        screen = XScreen(kind)
        a_out, b_out = os.path.join(work, f"{name}-a.mp4"), os.path.join(work, f"{name}-b.mp4")
        cases.append(Case(
            name, f"x11 {kind} screen 1080p30 + a {lw}x{lh} moving layer → mp4",
            lambda sc=screen, o=a_out: [args.broadcast, "record", o, "--video", f"x11:{sc.display}?cursor=off",
                                        "--video", f"test?x={x},y={y},width={lw},height={lh}",
                                        "--audio-mic", "none", "--fps", str(FPS), "--duration", f"{s}s",
                                        "--preset", "veryfast", "--tune", "zerolatency", "--video-bitrate", rate,
                                        "--rate-control", "cbr", "--keyframe-interval", "2s",
                                        "--quiet", "--log-level", "error", "-y"],
            lambda sc=screen, o=b_out: FF + ["-f", "x11grab", "-draw_mouse", "0", "-framerate", str(FPS),
                                             "-video_size", f"{w}x{h}", "-i", sc.display,
                                             "-re", "-stream_loop", "-1", "-f", "rawvideo", "-pix_fmt", "yuv420p",
                                             "-s", f"{lw}x{lh}", "-r", str(FPS), "-i", layer_pattern["video"],
                                             "-filter_complex", f"[0:v][1:v]overlay={x}:{y}:format=auto,format=yuv420p[v]",
                                             "-map", "[v]", "-t", str(s), "-an",
                                             "-c:v", "libx264"] + X264 + x264_rc(rate) + ["-movflags", "+faststart", o],
            s, s * FPS, True, latency=True, screen=screen, outputs=(a_out, b_out)))
    return cases


# Composition on another workload (issue 37 item 9): the same 1080p30 X11 screens with a quarter-size
# picture-in-picture, a 480x270 layer of the test pattern (25 % of the screen's width and height) in the
# bottom-right corner, opaque, x264 veryfast/zerolatency CRF 23 capped at 3 Mb/s (broadcast's
# `--rate-control crf --video-bitrate 3M`: maxrate 3M, a two-second VBV buffer, 6M; ffmpeg is given the
# same), against ffmpeg's x11grab + lavfi `testsrc` at 480x270 + a plain `overlay` (its default format,
# yuv420: the screen converted to yuv420p and the layer put there, as broadcast does). broadcast says the
# size as the issue does: `x=75%,y=75%,width=25%,height=25%`. Both sides paint a test pattern at 480x270
# each frame and convert it.
#
# `layer25a-*`: the same layer at 25 % opacity (broadcast's `opacity=25%`), against testsrc with a
# constant alpha of 64 (25 % of 255, rounded as broadcast rounds it: `lut=...:a=64` on yuva420p, the
# other planes as they are (`val`; lut's default clips them), no RGB round trip) + `overlay` in yuv420.
LAYER25_SIZE = (480, 270)
LAYER25_ALPHA = 64


def layer25_cases(args, work):
    cases = []
    w, h = SCREEN_SIZE
    lw, lh = LAYER25_SIZE
    x, y = w - lw, h - lh
    s = args.seconds
    cap = "3M"
    for translucent in (False, True):
        for kind in ("full", "static"):
            name = f"layer25{'a' if translucent else ''}-{'moving' if kind == 'full' else 'static'}"
            if not wanted(args, name):
                continue
            screen = XScreen(kind)
            a_out, b_out = os.path.join(work, f"{name}-a.mp4"), os.path.join(work, f"{name}-b.mp4")
            if translucent:
                layer = f"test?x={x},y={y},width={lw},height={lh},opacity=25%"
                chain = (f"[1:v]format=yuva420p,lut=y=val:u=val:v=val:a={LAYER25_ALPHA}[l];"
                         f"[0:v][l]overlay={x}:{y}:format=yuv420,format=yuv420p[v]")
                title = f"x11 {kind} screen 1080p30 + a {lw}x{lh} test layer at 25 % opacity → mp4, CRF 23 capped at {cap}"
            else:
                layer = "test?x=75%,y=75%,width=25%,height=25%"
                chain = f"[0:v][1:v]overlay={x}:{y},format=yuv420p[v]"
                title = f"x11 {kind} screen 1080p30 + an opaque {lw}x{lh} (25 %) test layer → mp4, CRF 23 capped at {cap}"
            cases.append(Case(
                name, title,
                lambda sc=screen, o=a_out, layer=layer: [
                    args.broadcast, "record", o, "--video", f"x11:{sc.display}?cursor=off", "--video", layer,
                    "--audio-mic", "none", "--fps", str(FPS), "--duration", f"{s}s",
                    "--preset", "veryfast", "--tune", "zerolatency", "--video-bitrate", cap,
                    "--rate-control", "crf", "--crf", "23", "--keyframe-interval", "2s",
                    "--quiet", "--log-level", "error", "-y"],
                lambda sc=screen, o=b_out, chain=chain: FF + [
                    "-f", "x11grab", "-draw_mouse", "0", "-framerate", str(FPS),
                    "-video_size", f"{w}x{h}", "-i", sc.display,
                    "-re", "-f", "lavfi", "-i", f"testsrc=size={lw}x{lh}:rate={FPS}",
                    "-filter_complex", chain,
                    "-map", "[v]", "-t", str(s), "-an", "-c:v", "libx264"] + X264
                + ["-crf", "23", "-maxrate", cap, "-bufsize", "6M", "-g", str(2 * FPS), "-pix_fmt", "yuv420p",
                   "-movflags", "+faststart", o],
                s, s * FPS, True, latency=True, screen=screen, outputs=(a_out, b_out)))
    return cases


def make_cases(args, work, rtmp, patterns):
    cases = []
    for key, (w, h, rate) in SIZES.items():
        s = args.seconds
        mp4a, mp4b = os.path.join(work, f"a-{key}.mp4"), os.path.join(work, f"b-{key}.mp4")
        pat = patterns.get(key)
        if pat:
            cases.append(Case(
                f"same-{key}", f"{h}p30 record → mp4, realtime, same pictures",
                lambda w=w, h=h, r=rate, s=s, o=mp4a: [args.broadcast, "record", o] + broadcast_encode(w, h, r, s, True),
                lambda w=w, h=h, r=rate, s=s, o=mp4b, pat=pat: FF + ffmpeg_same_inputs(pat, w, h, True)
                + ffmpeg_encode(w, h, r, s) + ["-movflags", "+faststart", o],
                s, s * FPS, True, latency=True))
            o = args.offline_seconds
            cases.append(Case(
                f"same-offline-{key}", f"{h}p30 record → mp4, non-realtime, same pictures",
                lambda w=w, h=h, r=rate, s=o, o_=mp4a: [args.broadcast, "record", o_] + broadcast_encode(w, h, r, s, False),
                lambda w=w, h=h, r=rate, s=o, o_=mp4b, pat=pat: FF + ffmpeg_same_inputs(pat, w, h, False)
                + ffmpeg_encode(w, h, r, s) + ["-movflags", "+faststart", o_],
                o, o * FPS, False))
        cases.append(Case(
            f"rec-{key}", f"{h}p30 record → mp4, realtime",
            lambda w=w, h=h, r=rate, s=s, o=mp4a: [args.broadcast, "record", o] + broadcast_encode(w, h, r, s, True),
            lambda w=w, h=h, r=rate, s=s, o=mp4b: FF + ffmpeg_inputs(w, h, True) + ffmpeg_encode(w, h, r, s)
            + ["-movflags", "+faststart", o],
            s, s * FPS, True, latency=True))
        o = args.offline_seconds
        cases.append(Case(
            f"offline-{key}", f"{h}p30 record → mp4, non-realtime",
            lambda w=w, h=h, r=rate, s=o, o_=mp4a: [args.broadcast, "record", o_] + broadcast_encode(w, h, r, s, False),
            lambda w=w, h=h, r=rate, s=o, o_=mp4b: FF + ffmpeg_inputs(w, h, False) + ffmpeg_encode(w, h, r, s)
            + ["-movflags", "+faststart", o_],
            o, o * FPS, False))
        if rtmp:
            url_a, url_b = f"{rtmp}/a{key}", f"{rtmp}/b{key}"
            cases.append(Case(
                f"stream-{key}", f"{h}p30 stream → nginx-rtmp, realtime",
                lambda w=w, h=h, r=rate, s=s, u=url_a: [args.broadcast, "stream", u] + broadcast_encode(w, h, r, s, True),
                lambda w=w, h=h, r=rate, s=s, u=url_b: FF + ffmpeg_inputs(w, h, True) + ffmpeg_encode(w, h, r, s)
                + ["-f", "flv", u],
                s, s * FPS, True, latency=True, needs_stream=True))
            cases.append(Case(
                f"stream-rec-{key}", f"{h}p30 stream + record, realtime",
                lambda w=w, h=h, r=rate, s=s, u=url_a, o_=mp4a:
                [args.broadcast, "stream", u, "--record", o_] + broadcast_encode(w, h, r, s, True),
                lambda w=w, h=h, r=rate, s=s, u=url_b, o_=mp4b: FF + ffmpeg_inputs(w, h, True)
                + ffmpeg_encode(w, h, r, s) + ["-flags", "+global_header", "-f", "tee",
                                               f"[f=mp4:movflags=+faststart]{o_}|[f=flv]{u}"],
                s, s * FPS, True, latency=True, needs_stream=True))
    # Two encodes from one 1080p30 picture (issue 36): the recording at 1920x1080 8M, the stream at
    # 1280x720 CBR 2.5M to nginx; ffmpeg does the same work with split + scale and identical x264
    # settings, from the same pictures.
    pat = patterns.get("1080")
    if rtmp and pat:
        s = args.seconds
        mp4a, mp4b = os.path.join(work, "a-encodes.mp4"), os.path.join(work, "b-encodes.mp4")
        cases.append(Case(
            "encodes-1080", "1080p30 record 8M + 720p stream 2.5M, two encodes, realtime, same pictures",
            lambda s=s, u=f"{rtmp}/aenc", o=mp4a: [args.broadcast, "stream", u, "--record", o, "--record-size", "1920x1080",
                                                    "--record-video-bitrate", "8M", "--record-rate-control", "cbr"]
            + broadcast_encode(1280, 720, "2500k", s, True),
            lambda s=s, u=f"{rtmp}/benc", o=mp4b, pat=pat: FF + ffmpeg_same_inputs(pat, 1920, 1080, True)
            # -t is an output option: each output needs its own, or the stream's never ends.
            + ["-t", str(s), "-filter_complex", "[0:v]split=2[full][small];[small]scale=1280:720[s720]",
               "-map", "[full]", "-map", "1:a", "-c:v", "libx264"] + X264 + x264_rc("8M")
            + ["-c:a", "aac", "-b:a", "128k", "-ac", "2", "-ar", "48000", "-movflags", "+faststart", o,
               "-map", "[s720]", "-map", "1:a", "-c:v", "libx264"] + X264 + x264_rc("2500k")
            + ["-c:a", "aac", "-b:a", "128k", "-ac", "2", "-ar", "48000", "-t", str(s), "-f", "flv", u],
            s, s * FPS, True, needs_stream=True))
    # The microphone's noise suppression (issue 38): broadcast against itself, A with --mic-denoise,
    # B without, audio only (the test tone as the microphone, AAC), as fast as it goes, so the
    # suppressor's share is not lost in the video encoder's. The ratio is A's CPU over B's.
    o = args.offline_seconds
    cases.append(Case(
        "mic-denoise", "audio only, mic → AAC → mkv, non-realtime: A --mic-denoise, B without (both broadcast)",
        lambda s=o, o_=os.path.join(work, "a-denoise.mkv"): [args.broadcast, "record", o_, "--video", "none", "--audio-mic", "test",
                                                             "--audio-app", "none", "--duration", f"{s}s", "--no-realtime",
                                                             "--quiet", "--log-level", "error", "-y", "--mic-denoise"],
        lambda s=o, o_=os.path.join(work, "b-denoise.mkv"): [args.broadcast, "record", o_, "--video", "none", "--audio-mic", "test",
                                                             "--audio-app", "none", "--duration", f"{s}s", "--no-realtime",
                                                             "--quiet", "--log-level", "error", "-y"],
        o, o * 100, False))
    return [c for c in cases if wanted(args, c.name)]


def wanted(args, name):
    return not args.cases or name in args.cases.split(",")


def median(values):
    return statistics.median(values) if values else float("nan")


def run_case(case, pairs, work):
    if case.screen:
        case.screen.start()
        try:
            result = run_pairs(case, pairs, work)
            a, b = (x264_options(path) for path in case.outputs)
            result.update({"x264_a": a, "x264_b": b, "x264_equal": a is not None and a == b})
            print(f"  x264 broadcast: {a}\n  x264 ffmpeg:    {b}", flush=True)
            if a != b:
                pa, pb = dict(o.split("=", 1) for o in (a or "").split() if "=" in o), \
                    dict(o.split("=", 1) for o in (b or "").split() if "=" in o)
                diff = {k: (pa.get(k), pb.get(k)) for k in sorted(set(pa) | set(pb)) if pa.get(k) != pb.get(k)}
                result["x264_differences"] = diff
                print(f"  x264 options differ: {diff}", flush=True)
            else:
                print("  x264 options: equal", flush=True)
            return result
        finally:
            case.screen.stop()
    return run_pairs(case, pairs, work)


def video_frames(path):
    """The video packets in a file (ffprobe), or None when it cannot be read."""
    r = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-count_packets", "-show_entries",
                        "stream=nb_read_packets", "-of", "csv=p=0", path], capture_output=True, text=True)
    try:
        return int(r.stdout.strip())
    except ValueError:
        return None


def run_pairs(case, pairs, work):
    rows = {"a": [], "b": [], "latency": []}
    for i in range(pairs):
        env = dict(os.environ)
        latency_file = os.path.join(work, f"latency-{case.name}-{i}.json")
        if case.latency:
            env["BROADCAST_LATENCY_FILE"] = latency_file
        rows["a"].append(run_measured(case.a(), env=env))
        if case.latency and os.path.exists(latency_file):
            with open(latency_file) as f:
                rows["latency"].append(json.load(f))
            os.unlink(latency_file)
        rows["b"].append(run_measured(case.b()))
        a, b = rows["a"][-1], rows["b"][-1]
        if case.outputs:
            # Frames in each file: on a loaded machine broadcast drops frames it cannot encode in
            # time (its queues are bounded) while ffmpeg's x11grab falls behind and runs late, so
            # CPU per media second alone would flatter the one that did less work.
            a["frames"], b["frames"] = (video_frames(path) for path in case.outputs)
        frames = f" frames {a['frames']}/{b['frames']}" if "frames" in a else ""
        print(f"  {case.name} pair {i + 1}/{pairs}: broadcast cpu {a['cpu']:.2f}s rss {a['rss_mb']:.0f}MB "
              f"dirty {a['dirty_mb']:.0f}MB wall {a['wall']:.1f}s | ffmpeg cpu {b['cpu']:.2f}s rss {b['rss_mb']:.0f}MB "
              f"dirty {b['dirty_mb']:.0f}MB wall {b['wall']:.1f}s |{frames}",
              flush=True)
    return summarize(case, rows)


def summarize(case, rows):
    a, b = rows["a"], rows["b"]
    per_media = lambda r: r["cpu"] / case.media_seconds
    fps = lambda r: case.frames / r["wall"]
    out = {
        "case": case.name, "title": case.title, "pairs": len(a), "media_seconds": case.media_seconds,
        "a_cpu_per_media_s": median([per_media(r) for r in a]),
        "b_cpu_per_media_s": median([per_media(r) for r in b]),
        "cpu_ratio": median([x["cpu"] / y["cpu"] for x, y in zip(a, b)]),
        "a_rss_mb": median([r["rss_mb"] for r in a]), "b_rss_mb": median([r["rss_mb"] for r in b]),
        "rss_ratio": median([x["rss_mb"] / y["rss_mb"] for x, y in zip(a, b)]),
        "a_dirty_mb": median([r["dirty_mb"] for r in a]), "b_dirty_mb": median([r["dirty_mb"] for r in b]),
        "dirty_ratio": median([x["dirty_mb"] / y["dirty_mb"] for x, y in zip(a, b) if y["dirty_mb"] > 0] or [float("nan")]),
        "a_fps": median([fps(r) for r in a]), "b_fps": median([fps(r) for r in b]),
        "fps_ratio": median([fps(x) / fps(y) for x, y in zip(a, b)]),
        "a_raw": a, "b_raw": b,
    }
    if all(r.get("frames") for r in a + b):
        # CPU per frame encoded, the same ratio without the frames one side dropped.
        out["a_frames"] = median([r["frames"] for r in a])
        out["b_frames"] = median([r["frames"] for r in b])
        out["cpu_per_frame_ratio"] = median([(x["cpu"] / x["frames"]) / (y["cpu"] / y["frames"]) for x, y in zip(a, b)])
    if rows["latency"]:
        out["latency_p50_ms"] = median([r["p50_ms"] for r in rows["latency"]])
        out["latency_p99_ms"] = median([r["p99_ms"] for r in rows["latency"]])
        out["latency_max_ms"] = max(r["max_ms"] for r in rows["latency"])
        if all("beyond_encoder_p99_ms" in r for r in rows["latency"]):
            out["beyond_encoder_p50_ms"] = median([r["beyond_encoder_p50_ms"] for r in rows["latency"]])
            out["beyond_encoder_p99_ms"] = median([r["beyond_encoder_p99_ms"] for r in rows["latency"]])
    return out


# Non-encoder overhead: the CPU a run spends outside the encoders, from perf samples of that same run
# (cpu-clock, every thread, user and kernel), classified by thread, shared object and symbol.
ENCODER_DSOS = ("libx264",)
# libavcodec holds the AAC encoder and the libx264 wrapper (encoder work) but also the AVPacket
# helpers every muxing path uses (not encoder work).
NOT_ENCODER_IN_AVCODEC = re.compile(r"^(av_packet_|av_new_packet|av_grow_packet|av_init_packet|avcodec_parameters_)")
# A thread that spends at least this share of its samples in the encoders' code is one of x264's
# worker (slice) threads: its kernel and libc time (waking the other slices, faulting in x264's own
# buffers) is encoder work too. The thread that calls the encoder also does everything else, so it is
# classified sample by sample; the same rule applies to ffmpeg's threads.
ENCODER_THREAD_SHARE = 0.85


# By call chain: a sample is the encoder's when the encoder is on its stack (libx264, or libavcodec
# under one of its encode entry points), wherever its leaf is: the libc memcpy x264 calls to take in
# a picture, AAC's libm cbrtf, the kernel waking x264's slice threads or faulting in its buffers.
# Everything else (capture, conversion, muxing, the session, their kernel time) is overhead.
ENCODER_ENTRY_POINTS = {"avcodec_send_frame", "avcodec_receive_packet", "avcodec_encode_video2",
                        "avcodec_encode_audio2", "avcodec_open2", "avcodec_close", "avcodec_free_context",
                        "avcodec_flush_buffers"}


def perf_overhead(cmd, work, name, media_seconds):
    data = os.path.join(work, f"perf-{name}.data")
    # DWARF unwinding (.eh_frame), since x264 and FFmpeg keep no frame pointers; 499 Hz keeps the
    # file (8 KB of stack per sample) to tens of MB for a 30 s run.
    record = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "499", "--call-graph", "dwarf,8192",
              "-o", data, "--"] + cmd
    usage = run_measured(record)
    result = classify_perf(data)
    result.update(classify_callchains(data))
    os.unlink(data)
    result["perf_cpu"] = usage["cpu"]
    return result


def classify_callchains(data):
    """Non-encoder share of the samples in `data` by call chain (see ENCODER_ENTRY_POINTS), and the
    leaf symbols of the non-encoder samples, biggest first."""
    script = subprocess.run(["perf", "script", "-i", data, "-F", "tid,ip,sym,dso"],
                            capture_output=True, text=True).stdout
    total = other = 0
    top = {}

    def close(frames):
        nonlocal total, other
        if not frames:
            return
        total += 1
        encoder = any("libx264" in dso or ("libavcodec" in dso and sym in ENCODER_ENTRY_POINTS)
                      for sym, dso in frames)
        # A chain that could not be unwound out of libavcodec (hand-written assembly has no unwind
        # tables) is the encoder's when its leaf is: libavcodec is nothing but codecs and packet helpers.
        leaf_sym, leaf_dso = frames[0]
        if not encoder and "libavcodec" in leaf_dso and not NOT_ENCODER_IN_AVCODEC.match(leaf_sym):
            encoder = all("libavcodec" in dso for _, dso in frames)
        if not encoder:
            other += 1
            key = (os.path.basename(leaf_dso), leaf_sym)
            top[key] = top.get(key, 0) + 1

    frames = []
    for line in script.splitlines():
        if line.startswith("\t"):
            m = re.match(r"\t\s*[0-9a-f]+\s+(.*?)\s+\((.*)\)$", line)
            if m and m.group(2) != "inlined":  # an inlined frame's real one follows it
                frames.append((m.group(1).split("+")[0], m.group(2)))
        elif line.strip():
            close(frames)
            frames = []
    close(frames)
    if not total:
        return {}
    return {"chain_non_encoder_share": other / total,
            "chain_top": sorted(((100 * n / total, d, s) for (d, s), n in top.items()), reverse=True)[:12]}


def classify_perf(data):
    """Encoder and non-encoder shares of the samples in perf file `data`."""
    report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "pid,dso,sym", "--stdio",
                             "-q", "--percent-limit", "0", "-F", "overhead,pid,dso,sym", "-g", "none"],
                            capture_output=True, text=True, check=True).stdout
    samples = []  # (pct, thread, dso, sym, is encoder code)
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\d+):\S*\s+(\S+)\s+\[.\]\s+(.*)$", line)
        if not m:
            continue
        pct, tid, dso, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4).strip()
        code = dso.startswith(ENCODER_DSOS) or (dso.startswith("libavcodec") and not NOT_ENCODER_IN_AVCODEC.match(sym))
        samples.append((pct, tid, dso, sym, code))
    per_thread, in_encoder = {}, {}
    for pct, tid, _, _, code in samples:
        per_thread[tid] = per_thread.get(tid, 0) + pct
        in_encoder[tid] = in_encoder.get(tid, 0) + (pct if code else 0)
    workers = {t for t, total in per_thread.items() if total > 0 and in_encoder[t] / total >= ENCODER_THREAD_SHARE}
    encoder = other = 0.0
    top = {}
    for pct, tid, dso, sym, code in samples:
        if code or tid in workers:
            encoder += pct
        else:
            other += pct
            top[(dso, sym)] = top.get((dso, sym), 0) + pct
    total = encoder + other
    share = other / total if total else float("nan")
    # perf's own cost lands outside the child's rusage only partly; the share is what matters,
    # applied to the run's CPU without perf is done by the caller.
    return {"non_encoder_share": share,
            "top": sorted(((p, d, s) for (d, s), p in top.items()), reverse=True)[:12]}


def machine():
    def first(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0].strip()
        except (OSError, IndexError):
            return "?"
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return {"nproc": os.cpu_count(), "cpu": model, "kernel": platform.release(),
            "ffmpeg": first(["ffmpeg", "-version"]), "swift": first(["swift", "--version"]) if shutil.which("swift")
            else "?", "load_at_start": load}


class Nginx:
    """A throwaway nginx-rtmp (own temp dir, one process) for the stream cases; `record=True` keeps
    what it receives in record_dir (one .flv per publish: benchmarks/dip.py reads it)."""

    MODULE = "/usr/lib/nginx/modules/ngx_rtmp_module.so"

    def __init__(self, work, record=False):
        self.dir = os.path.join(work, "nginx")
        self.record_dir = os.path.join(self.dir, "rec")
        os.makedirs(self.record_dir, exist_ok=True)
        recording = f" record all; record_path {self.record_dir}; record_unique on;" if record else ""
        os.makedirs(self.dir, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""load_module {self.MODULE};
daemon off; master_process off; pid {self.dir}/nginx.pid; error_log {self.dir}/error.log warn;
events {{ worker_connections 64; }}
rtmp {{ server {{ listen 127.0.0.1:{self.port}; application live {{ live on;{recording} }} }} }}
""")
        self.proc = subprocess.Popen(["/usr/sbin/nginx", "-c", conf, "-p", self.dir, "-e", f"{self.dir}/error.log"])
        for _ in range(50):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        self.url = f"rtmp://127.0.0.1:{self.port}/live"

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def stream_available(broadcast):
    try:
        return subprocess.run([broadcast, "stream", "--help"], capture_output=True).returncode == 0 \
            and os.path.exists(Nginx.MODULE)
    except OSError:
        return False


def fmt(v, spec=".2f"):
    return "—" if v is None or v != v else format(v, spec)


def markdown(info, results, overhead, args):
    lines = [f"Machine: {info['nproc']} cores, {info['cpu']}, kernel {info['kernel']}; {info['ffmpeg']}; "
             f"{info['swift']}. Load average at start: {info['load_at_start']} (other builds running: "
             "wall-clock figures are noisy, CPU-time ratios much less so). "
             f"{args.pairs} pairs per case, run A B A B.", "",
             "| case | CPU-s per media-s: broadcast / ffmpeg | ratio (median of pairs) | peak RSS MB: broadcast / ffmpeg "
             "| RSS ratio | peak private dirty MB: broadcast / ffmpeg | private dirty ratio "
             "| media fps: broadcast / ffmpeg | fps ratio | latency p50 / p99 ms "
             "| of which before the encoder p50 / p99 ms | x264 options (screen cases) "
             "| frames in the files: broadcast / ffmpeg (CPU per frame ratio) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lat = (f"{fmt(r.get('latency_p50_ms'), '.1f')} / {fmt(r.get('latency_p99_ms'), '.1f')}"
               if "latency_p50_ms" in r else "—")
        lat += (f" | {fmt(r.get('beyond_encoder_p50_ms'), '.1f')} / {fmt(r.get('beyond_encoder_p99_ms'), '.1f')}"
                if "beyond_encoder_p99_ms" in r else " | —")
        offline = "offline" in r["case"]
        fps_cells = (f"{fmt(r['a_fps'], '.0f')} / {fmt(r['b_fps'], '.0f')} | {fmt(r['fps_ratio'])}"
                     if offline else "realtime | —")
        if "x264_equal" in r:
            lat += " | " + ("equal" if r["x264_equal"] else f"DIFFER: {r.get('x264_differences')}")
        else:
            lat += " | —"
        lat += (f" | {fmt(r['a_frames'], '.0f')} / {fmt(r['b_frames'], '.0f')} ({fmt(r['cpu_per_frame_ratio'])})"
                if "cpu_per_frame_ratio" in r else " | —")
        lines.append(f"| {r['title']} | {fmt(r['a_cpu_per_media_s'], '.3f')} / {fmt(r['b_cpu_per_media_s'], '.3f')} "
                     f"| **{fmt(r['cpu_ratio'])}** | {fmt(r['a_rss_mb'], '.0f')} / {fmt(r['b_rss_mb'], '.0f')} "
                     f"| {fmt(r['rss_ratio'])} | {fmt(r.get('a_dirty_mb'), '.0f')} / {fmt(r.get('b_dirty_mb'), '.0f')} "
                     f"| {fmt(r.get('dirty_ratio'))} | {fps_cells} | {lat} |")
    if overhead:
        lines += ["", "Non-encoder overhead (perf cpu-clock samples of one realtime run each, same pictures; everything "
                  "outside libx264, libavcodec's encoders and x264's worker threads; in % of one core = share × CPU-s "
                  "per media-s):", "",
                  "| case | broadcast | ffmpeg |", "|---|---|---|"]
        for name, o in overhead.items():
            lines.append(f"| {name} | {fmt(o['a_pct_core'], '.1f')} % ({fmt(100 * o['a_share'], '.1f')} % of its CPU) "
                         f"| {fmt(o['b_pct_core'], '.1f')} % ({fmt(100 * o['b_share'], '.1f')} % of its CPU) |")
        chained = [(n, o) for n, o in overhead.items() if "a_chain_share" in o]
        if chained:
            lines += ["", "The same runs by call chain (a sample is the encoder's when libx264 or libavcodec's "
                      "encode calls are on its stack, wherever its leaf is):", "",
                      "| case | broadcast | ffmpeg |", "|---|---|---|"]
            for name, o in chained:
                lines.append(f"| {name} | {fmt(o['a_chain_pct_core'], '.1f')} % ({fmt(100 * o['a_chain_share'], '.1f')} % "
                             f"of its CPU) | {fmt(o['b_chain_pct_core'], '.1f')} % ({fmt(100 * o['b_chain_share'], '.1f')} % of its CPU) |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--broadcast", required=True, help="the broadcast binary (a release build)")
    p.add_argument("--pairs", type=int, default=int(os.environ.get("PAIRS", 3)))
    p.add_argument("--seconds", type=int, default=8, help="media seconds of a realtime run")
    p.add_argument("--offline-seconds", type=int, default=60,
                   help="media seconds of a non-realtime run (60: several seconds of wall time even at 720p)")
    p.add_argument("--cases", default=os.environ.get("CASES"), help="comma-separated case names (default: all)")
    p.add_argument("--overhead-seconds", type=int, default=30,
                   help="media seconds of the perf runs (start-up, ~0.1 s of CPU, weighs 1/N of it)")
    p.add_argument("--no-overhead", action="store_true", help="skip the perf-based non-encoder overhead runs")
    p.add_argument("--out", default="out/bench", help="where results.json and results.md go")
    args = p.parse_args()
    args.broadcast = os.path.abspath(args.broadcast)
    os.makedirs(args.out, exist_ok=True)
    info = machine()
    print(f"machine: {info}", flush=True)

    with tempfile.TemporaryDirectory(prefix="broadcast-bench-") as work:
        nginx = Nginx(work) if stream_available(args.broadcast) else None
        if nginx is None:
            print("stream cases: pending (`broadcast stream --help` does not work or nginx-rtmp is missing)")
        try:
            patterns = {key: make_pattern(args.broadcast, work, key, w, h) for key, (w, h, _) in SIZES.items()
                        if wanted(args, f"same-{key}") or wanted(args, f"same-offline-{key}")
                        or wanted(args, f"overhead-{key}") or (key == "1080" and wanted(args, "encodes-1080"))}
            results = []
            layers = (layer_cases(args, work, make_pattern(args.broadcast, work, "layer", *LAYER_SIZE))
                      if wanted(args, "layer-moving") or wanted(args, "layer-static") else [])
            for case in (make_cases(args, work, nginx.url if nginx else None, patterns) + screen_cases(args, work) + layers
                         + layer25_cases(args, work)):
                print(f"{case.name}: {case.title}", flush=True)
                results.append(run_case(case, args.pairs, work))
            overhead = {}
            if not args.no_overhead and shutil.which("perf"):
                for key, (w, h, rate) in SIZES.items():
                    if not wanted(args, f"overhead-{key}"):
                        continue
                    s = args.overhead_seconds
                    print(f"overhead-{key}: perf record of one realtime {s} s run each", flush=True)
                    a = perf_overhead([args.broadcast, "record", os.path.join(work, "o.mp4")]
                                      + broadcast_encode(w, h, rate, s, True), work, f"a{key}", s)
                    b = perf_overhead(FF + ffmpeg_same_inputs(patterns[key], w, h, True) + ffmpeg_encode(w, h, rate, s)
                                      + ["-movflags", "+faststart", os.path.join(work, "o2.mp4")], work, f"b{key}", s)
                    rec = next((r for r in results if r["case"] == f"same-{key}"), None)
                    a_cpu = rec["a_cpu_per_media_s"] if rec else a["perf_cpu"] / s
                    b_cpu = rec["b_cpu_per_media_s"] if rec else b["perf_cpu"] / s
                    overhead[f"{h}p30 record, realtime"] = {
                        "a_share": a["non_encoder_share"], "b_share": b["non_encoder_share"],
                        "a_pct_core": 100 * a["non_encoder_share"] * a_cpu,
                        "b_pct_core": 100 * b["non_encoder_share"] * b_cpu,
                        "a_top": a["top"], "b_top": b["top"]}
                    if "chain_non_encoder_share" in a and "chain_non_encoder_share" in b:
                        overhead[f"{h}p30 record, realtime"].update({
                            "a_chain_share": a["chain_non_encoder_share"], "b_chain_share": b["chain_non_encoder_share"],
                            "a_chain_pct_core": 100 * a["chain_non_encoder_share"] * a_cpu,
                            "b_chain_pct_core": 100 * b["chain_non_encoder_share"] * b_cpu,
                            "a_chain_top": a["chain_top"], "b_chain_top": b["chain_top"]})
                    o = overhead[f"{h}p30 record, realtime"]
                    print(f"  non-encoder by code/thread: broadcast {100 * a['non_encoder_share']:.1f}% of CPU, "
                          f"ffmpeg {100 * b['non_encoder_share']:.1f}%", flush=True)
                    if "a_chain_share" in o:
                        print(f"  non-encoder by call chain:  broadcast {100 * o['a_chain_share']:.1f}% of CPU "
                              f"({o['a_chain_pct_core']:.1f}% of a core), ffmpeg {100 * o['b_chain_share']:.1f}% "
                              f"({o['b_chain_pct_core']:.1f}%)", flush=True)
                    for who, top in (("broadcast", o.get("a_chain_top", a["top"])), ("ffmpeg   ", o.get("b_chain_top", b["top"]))):
                        for pct, dso, sym in top[:6]:
                            print(f"    {who} {pct:5.2f}% {dso} {sym}")
        finally:
            if nginx:
                nginx.stop()

    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"machine": info, "results": results, "overhead": overhead}, f, indent=1)
    table = markdown(info, results, overhead, args)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)
    print()
    print(table)


if __name__ == "__main__":
    sys.exit(main())
