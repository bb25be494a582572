#!/usr/bin/env bash
# CPU per media second of Wayland capture through the ScreenCast portal + PipeWire, beside the X11
# path at the same size, both + H.264 encode (broadcast's defaults, no audio).
#
#   benchmarks/portal.sh [path/to/broadcast] [seconds]    (default: the release build, 10 s)
#
# Screens: "static" — one solid colour (Wayland: sway's background; X11: Xvfb with a full-screen
# solid xlogo): the portal sends one frame and broadcast repeats it, X11 grabs once (DAMAGE) and
# repeats; "terminal" (Wayland only) — a small terminal redrawing 30 times a second, so every frame
# is new from PipeWire (copied out of its buffer). CPU is user+sys of the broadcast process only
# (the compositor's copy is sway's). Uses scripts/desktop-session.sh (make deps installs it all).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
BROADCAST=${1:-$(swift build -c release --show-bin-path)/broadcast}
SECONDS_PER_RUN=${2:-10}
OUT=$(mktemp -d)
trap 'for d in "$OUT"/desk-*; do [ -d "$d" ] && "$HERE/scripts/desktop-session.sh" stop "$d" >/dev/null 2>&1; done; rm -rf "$OUT"' EXIT

cpu() { # ENV-FILE command... -> prints user+sys seconds
    local envfile=$1; shift
    ( [ -n "$envfile" ] && . "$envfile"; /usr/bin/time -f "%U %S" -o "$OUT/time" "$@" >/dev/null 2>"$OUT/stderr" ) \
        || { cat "$OUT/stderr" >&2; return 1; }
    awk '{ printf "%.2f", $1 + $2 }' "$OUT/time"
}
per() { awk -v c="$1" -v s="$SECONDS_PER_RUN" 'BEGIN{printf "%.3f", c/s}'; }

echo "| size | screen | portal (PipeWire) CPU-s/media-s | X11 CPU-s/media-s |"
echo "|---|---|---|---|"
for size in 1280x720; do
    w=${size%x*}; h=${size#*x}
    # X11: Xvfb with a solid red window over the whole screen.
    n=$((200 + RANDOM % 100))
    while [ -e /tmp/.X11-unix/X$n ] || [ -e /tmp/.X$n-lock ]; do n=$((n + 1)); done
    Xvfb :$n -screen 0 ${size}x24 -nolisten tcp -noreset >/dev/null 2>&1 & xvfb=$!
    for _ in $(seq 100); do [ -e /tmp/.X11-unix/X$n ] && break; sleep 0.05; done
    DISPLAY=:$n xlogo -bw 0 -bg red -fg red -geometry ${size}+0+0 >/dev/null 2>&1 & client=$!
    sleep 1
    x=$(cpu "" "$BROADCAST" record "$OUT/x.mp4" -y --video "x11::$n?cursor=off" --audio-mic none --fps 30 \
        --duration ${SECONDS_PER_RUN}s --quiet)
    kill -9 $client $xvfb; wait $client $xvfb 2>/dev/null || true
    rm -f /tmp/.X$n-lock /tmp/.X11-unix/X$n

    for screen in static terminal; do
        d="$OUT/desk-$screen"
        activity=0; [ $screen = terminal ] && activity=1
        DESKTOP_SIZE=$size DESKTOP_BG='#ff0000' DESKTOP_ACTIVITY=$activity "$HERE/scripts/desktop-session.sh" start "$d" >/dev/null 2>&1
        # The first frame comes with the first change on screen.
        ( . "$d/env.sh"; sleep 1.5; swaymsg output HEADLESS-1 bg '#ff0000' solid_color >/dev/null 2>&1 ) &
        p=$(cpu "$d/env.sh" "$BROADCAST" record "$OUT/p.mp4" -y --video "portal?cursor=hidden" --audio-mic none --fps 30 \
            --duration ${SECONDS_PER_RUN}s --quiet)
        wait
        "$HERE/scripts/desktop-session.sh" stop "$d" >/dev/null 2>&1 || true
        if [ $screen = static ]; then
            echo "| $size | static (solid colour) | $(per "$p") | $(per "$x") |"
        else
            echo "| $size | terminal redrawing 30/s | $(per "$p") | – |"
        fi
    done
done
