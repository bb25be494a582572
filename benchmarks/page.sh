#!/bin/sh
# The control page's cost (issue 27): the daemon's CPU and frames with five pages open in headless
# chromium (preview on, meters, events) beside none, alternately, PAIRS times.
#
#   benchmarks/page.sh [PAIRS] [SECONDS]      (defaults: 3 pairs of 30 s)
#
# The daemon records the test pattern (1280x720, 30 fps) and the tone to MKV, with a TCP control
# listener; each run measures, over SECONDS after a 3 s settle: the daemon's user + system CPU
# seconds (/proc/PID/stat), video frames encoded and the session's drops (GET /v1/status).
# Prints one line per run and the medians. Nothing here is a pass/fail threshold.
set -eu
PAIRS=${1:-3}
SECONDS_PER_RUN=${2:-30}
BIN=${BROADCAST:-$(swift build -c release --show-bin-path 2>/dev/null)/broadcast}
[ -x "$BIN" ] || { echo "no broadcast binary at $BIN (swift build -c release, or BROADCAST=path)"; exit 2; }
command -v chromium >/dev/null || { echo "chromium is not installed (make deps)"; exit 2; }
WORK=$(mktemp -d)
trap 'kill $(cat "$WORK"/*.pid 2>/dev/null) 2>/dev/null || true; rm -rf "$WORK"' EXIT
TOKEN=benchmark-token-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
TICK=$(getconf CLK_TCK)

cpu() { awk -v t="$TICK" '{ sub(/.*\) /, ""); split($0, f, " "); print (f[12] + f[13]) / t }' "/proc/$1/stat"; }
status() { curl -s --unix-socket "$WORK/c.sock" http://x/v1/status; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

run() { # $1: pages
    rm -f "$WORK"/rec.mkv
    cat > "$WORK/d.toml" <<EOF
[video]
size = "1280x720"
fps = 30
[audio]
mic = "test"
[control]
socket = "$WORK/c.sock"
tcp = "127.0.0.1:$PORT"
token = "$TOKEN"
[[output]]
name = "rec"
path = "$WORK/rec.mkv"
EOF
    "$BIN" daemon --config "$WORK/d.toml" 2>"$WORK/daemon.log" & echo $! > "$WORK/daemon.pid"
    DAEMON=$(cat "$WORK/daemon.pid")
    for _ in $(seq 1 100); do [ -S "$WORK/c.sock" ] && break; sleep 0.1; done
    i=0
    while [ $i -lt "$1" ]; do
        chromium --headless=new --no-sandbox --disable-gpu --user-data-dir="$WORK/profile$i" --remote-debugging-port=0 \
            "http://127.0.0.1:$PORT/#token=$TOKEN" >/dev/null 2>&1 & echo $! > "$WORK/chromium$i.pid"
        i=$((i + 1))
    done
    sleep 3
    c0=$(cpu "$DAEMON"); s0=$(status)
    sleep "$SECONDS_PER_RUN"
    c1=$(cpu "$DAEMON"); s1=$(status)
    for p in "$WORK"/chromium*.pid; do [ -e "$p" ] && kill "$(cat "$p")" 2>/dev/null; rm -f "$p"; done
    kill -TERM "$DAEMON"; wait "$DAEMON" || true; rm -f "$WORK/daemon.pid"
    f0=$(echo "$s0" | field 'd["video_frames_encoded"]'); f1=$(echo "$s1" | field 'd["video_frames_encoded"]')
    drops=$(echo "$s1" | field 'sum(sum(t["dropped"][k] for k in ("queue_full","source","out_of_order")) for t in d["types"].values())')
    awk -v p="$1" -v c0="$c0" -v c1="$c1" -v f0="$f0" -v f1="$f1" -v s="$SECONDS_PER_RUN" -v d="$drops" \
        'BEGIN { printf "pages=%d cpu=%.3f s/s fps=%.2f drops=%d\n", p, (c1 - c0) / s, (f1 - f0) / s, d }'
}

: > "$WORK/results"
for _ in $(seq 1 "$PAIRS"); do
    run 0 | tee -a "$WORK/results"
    run 5 | tee -a "$WORK/results"
done
echo "medians over $PAIRS runs each ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)):"
for p in 0 5; do
    grep "^pages=$p " "$WORK/results" | sed 's/[a-z]*=//g; s/ s\/s//' | sort -n -k2 |
        awk -v p="$p" '{ c[NR] = $2; f[NR] = $3; d += $4 } END { m = int((NR + 1) / 2); printf "  %d pages: cpu %.3f s per s, %.2f fps, %d drops in all\n", p, c[m], f[m], d }'
done
