#!/usr/bin/env bash
# CPU per media second of X11 screen capture + H.264 encode: broadcast vs ffmpeg -f x11grab, same
# Xvfb display, size, rate and x264 settings (veryfast, zerolatency, 3 Mb/s, no audio).
#
#   benchmarks/x11.sh [path/to/broadcast] [seconds]      (default: the release build, 10 s)
#
# Two screens per size: "moving" (ico redrawing a window over the whole screen, so every frame is
# new) and "static" (solid windows: broadcast's DAMAGE-driven capture grabs once and repeats).
# Needs xvfb, x11-apps, ffmpeg (make deps). Prints a markdown table; CPU is user+sys of the process.
set -euo pipefail
BROADCAST=${1:-$(swift build -c release --show-bin-path)/broadcast}
SECONDS_PER_RUN=${2:-10}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

cpu() { # command... -> prints user+sys seconds
    /usr/bin/time -f "%U %S" -o "$OUT/time" "$@" >/dev/null 2>"$OUT/stderr" || { cat "$OUT/stderr" >&2; return 1; }
    awk '{ printf "%.2f", $1 + $2 }' "$OUT/time"
}

echo "| size | screen | broadcast CPU-s/media-s | ffmpeg x11grab CPU-s/media-s |"
echo "|---|---|---|---|"
for size in 1280x720 1920x1080; do
    w=${size%x*}; h=${size#*x}
    n=$((200 + RANDOM % 100))
    while [ -e /tmp/.X11-unix/X$n ] || [ -e /tmp/.X$n-lock ]; do n=$((n + 1)); done
    Xvfb :$n -screen 0 ${size}x24 -nolisten tcp -noreset >/dev/null 2>&1 & xvfb=$!
    for _ in $(seq 100); do [ -e /tmp/.X11-unix/X$n ] && break; sleep 0.05; done
    for screen in moving static; do
        if [ $screen = moving ]; then
            DISPLAY=:$n ico -geometry ${size}+0+0 >/dev/null 2>&1 & client=$!
        else
            DISPLAY=:$n xlogo -bw 0 -bg red -fg red -geometry $((w / 2))x$((h / 2))+0+0 >/dev/null 2>&1 & client=$!
        fi
        sleep 1
        b=$(cpu "$BROADCAST" record "$OUT/b.mp4" -y --video "x11::$n?cursor=off" --audio-mic none --fps 30 \
            --duration ${SECONDS_PER_RUN}s --quiet)
        f=$(cpu ffmpeg -nostdin -v error -y -f x11grab -draw_mouse 0 -framerate 30 -video_size $size -i :$n \
            -t $SECONDS_PER_RUN -c:v libx264 -preset veryfast -tune zerolatency -b:v 3M -maxrate 4.5M -bufsize 6M \
            -pix_fmt yuv420p "$OUT/f.mp4")
        kill -9 $client; wait $client 2>/dev/null || true
        echo "| $size | $screen | $(awk -v c=$b -v s=$SECONDS_PER_RUN 'BEGIN{printf "%.3f", c/s}') | $(awk -v c=$f -v s=$SECONDS_PER_RUN 'BEGIN{printf "%.3f", c/s}') |"
    done
    kill -9 $xvfb; wait $xvfb 2>/dev/null || true
    rm -f /tmp/.X$n-lock /tmp/.X11-unix/X$n
done
