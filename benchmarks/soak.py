#!/usr/bin/env python3
"""Soak: records a long stretch of media non-realtime from the test sources, then reports
- memory: resident set size sampled from /proc while it runs, early vs late, and the peak (wait4);
- A/V sync at the end: the test pattern's white frame and the tone's beep both start every whole
  second; over the last minute of the file, each white frame's time (ffmpeg signalstats YAVG) is
  paired with the nearest beep onset (silencedetect's silence_end) and the offsets summarized.
The first minute is measured the same way, for reference.

Usage: benchmarks/soak.py --broadcast PATH [--duration 3600] [--size 320x180] [--out DIR]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def av_offsets(path, start, length):
    """Offsets (ms, audio minus video) between each white frame and the nearest beep onset."""
    cmd = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "info", "-copyts", "-ss", str(start), "-t", str(length),
           "-i", path, "-vf", "signalstats,metadata=mode=print:key=lavfi.signalstats.YAVG",
           "-af", "silencedetect=noise=-20dB:d=0.02", "-f", "null", "-"]
    err = subprocess.run(cmd, capture_output=True, text=True).stderr
    flashes, onsets = [], []
    pts = None
    for line in err.splitlines():
        m = re.search(r"pts_time:([\d.]+)", line)
        if m:
            pts = float(m.group(1))
        m = re.search(r"lavfi\.signalstats\.YAVG=([\d.]+)", line)
        if m and pts is not None and float(m.group(1)) > 200:
            flashes.append(pts)
        m = re.search(r"silence_end: ([\d.]+)", line)
        if m:
            onsets.append(float(m.group(1)))
    offsets = []
    for v in flashes:
        near = min(onsets, key=lambda a: abs(a - v), default=None)
        if near is not None and abs(near - v) < 0.5:
            offsets.append(1000 * (near - v))
    return {"flashes": len(flashes), "beeps": len(onsets), "pairs": len(offsets),
            "median_ms": statistics.median(offsets) if offsets else None,
            "max_abs_ms": max(abs(o) for o in offsets) if offsets else None}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--broadcast", required=True)
    p.add_argument("--duration", type=int, default=3600, help="media seconds")
    p.add_argument("--size", default="320x180")
    p.add_argument("--out", default="out/soak")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(os.path.abspath(args.out), "soak.mp4")
    cmd = [os.path.abspath(args.broadcast), "record", path, "-y", "--video", "test", "--audio-mic", "test",
           "--size", args.size, "--fps", "30", "--duration", f"{args.duration}s", "--no-realtime",
           "--preset", "veryfast", "--tune", "zerolatency", "--video-bitrate", "500k", "--quiet"]
    print(" ".join(cmd), flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    samples = []
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        kb = rss_kb(proc.pid)
        if kb:
            samples.append((time.monotonic() - start, kb))
        time.sleep(1)
    wall = time.monotonic() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        print(f"broadcast exited {code}")
        return 1
    # Early: the largest RSS seen in the second tenth of the run (past start-up); late: in the last tenth.
    early = [kb for t, kb in samples if 0.1 * wall <= t < 0.2 * wall]
    late = [kb for t, kb in samples if t >= 0.9 * wall]
    result = {
        "media_seconds": args.duration, "size": args.size, "wall_seconds": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024,
        "rss_early_mb": max(early) / 1024 if early else None, "rss_late_mb": max(late) / 1024 if late else None,
        "rss_samples": len(samples),
        # (wall seconds, MB) every ~5 % of the run: growth while recording vs the finalize at the end.
        "rss_timeline": [(round(t), round(kb / 1024, 1)) for t, kb in samples[:: max(1, len(samples) // 20)]],
        "av_first_minute": av_offsets(path, 0, 60),
        "av_last_minute": av_offsets(path, max(0, args.duration - 60), 60),
    }
    with open(os.path.join(args.out, "soak.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
