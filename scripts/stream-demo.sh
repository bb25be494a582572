#!/usr/bin/env bash
# make demo, part two: stream the test source to a local nginx-rtmp for a few seconds while recording it.
# nginx runs from a config in a temp dir (one process, no daemon) and is stopped by its PID afterwards.
# Usage: scripts/stream-demo.sh BROADCAST_BINARY OUT_DIR [SECONDS]
set -euo pipefail
bin=$1; out=$2; seconds=${3:-10}
module=/usr/lib/nginx/modules/ngx_rtmp_module.so
[ -f "$module" ] || { echo "nginx's RTMP module is missing: apt-get install nginx libnginx-mod-rtmp"; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
port=1935
if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then port=19350; fi   # 1935 taken: use another
cat > "$tmp/nginx.conf" <<CONF
load_module $module;
daemon off;
master_process off;
pid $tmp/nginx.pid;
error_log $tmp/error.log info;
events { worker_connections 64; }
rtmp {
    server {
        listen 127.0.0.1:$port;
        application live { live on; record all; record_path $out; record_suffix -server.flv; record_unique off; }
    }
}
CONF
/usr/sbin/nginx -c "$tmp/nginx.conf" -p "$tmp" -e "$tmp/error.log" &
stop() { [ -f "$tmp/nginx.pid" ] && kill "$(cat "$tmp/nginx.pid")" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap stop EXIT
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
url=rtmp://127.0.0.1:$port/live/demo
[ "$port" = 1935 ] && url=rtmp://127.0.0.1/live/demo
echo "nginx-rtmp (pid $(cat "$tmp/nginx.pid" 2>/dev/null || echo '?')) listening on 127.0.0.1:$port"
echo "Watch it live while it runs:  ffplay $url"
"$bin" stream "$url" --record "$out/demo-stream.mp4" -y --video test --audio-mic test --duration "${seconds}s"
echo
echo "Recorded locally:     $out/demo-stream.mp4"
echo "nginx's own copy:     $(ls "$out"/demo*-server.flv 2>/dev/null | head -1)"
