#!/bin/sh
# vm/guest-systemd.sh - the daemon under its own unit, systemd/broadcast.service, with real systemd
# as PID 1 (vm/run-guest.sh with VM_INIT=systemd: this script is the oneshot vmh-guest.service).
# It installs what `make install` installs (binary, unit, sysusers, a config in /etc/broadcast),
# starts the service capturing vivid's webcam and snd-aloop, recording into /var/lib/broadcast and
# streaming to a local nginx-rtmp with the key from /etc/broadcast/broadcast.env, with an
# on_file_finished hook; reads the control socket as root, as a member of the group broadcast and
# as a stranger; reloads; stops; then checks the recording, the stream, the hook and the journal.
# A setting of the unit that takes away a device, an address family, a system call or a file the
# daemon needs fails a check here. Ends with "N passed, N failed"; non-zero on any failure.
set -u
. ./env.sh
B=${BROADCAST:?BROADCAST (the host-built binary) is not set}
REPO=${REPO:?REPO (the source tree: systemd/ is installed from it) is not set}
passed=0
failed=0
ts() { echo "=== [$(cut -d' ' -f1 /proc/uptime)s] $*"; }
ok() { passed=$((passed + 1)); echo "PASS: $*"; }
ko() { failed=$((failed + 1)); echo "FAIL: $*"; }
check() { name=$1; shift; if "$@"; then ok "$name"; else ko "$name"; fi; }
contains() { grep -q -- "$2" "$1"; }
frames() { ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=nb_read_frames -of csv=p=0 "$1" 2>/dev/null | head -1 | tr -dc 0-9; }
loudness() { ffmpeg -nostdin -hide_banner -i "$1" -vn -af volumedetect -f null - 2>&1 | sed -n 's/.*max_volume: \(-*[0-9.]*\) dB.*/\1/p'; }
clean() { ffmpeg -nostdin -v error -i "$1" -enc_time_base -1 -f null - > "$2" 2>&1 && [ ! -s "$2" ]; }
wait_playback() {
    for _ in $(seq 300); do
        awk '/^Cable [0-9]+ substream /{ s = $4 + 0 } /running:/{ if (s == 0 && $2 % 2 == 1) f = 1 } END { exit !f }' \
            '/proc/asound/Loopback/cable#0' && return 0
        sleep 0.1
    done
    return 1
}
journal() { journalctl -u broadcast.service --no-pager -o cat > journal.txt 2>&1; }
KEY=sk-vmtest-7f3a91   # the stream key: must reach nginx, and nothing else

ts "kernel $(uname -r); PID 1: $(cat /proc/1/comm); $(systemctl --version | head -1)"
check "PID 1 is systemd" [ "$(cat /proc/1/comm)" = systemd ]
udevadm settle --timeout=120
ls -l /dev/video0 /dev/snd/ | tr -s ' ' | cut -d' ' -f1,3,4,10 | tr '\n' ' '; echo
check "udev gave /dev/video0 the group video" sh -c '[ "$(stat -c %G /dev/video0)" = video ]'

ts "1. install as make install does"
# The Makefile's install target, with the binary built on the host.
install -D -m 0755 "$B" /usr/local/bin/broadcast
install -D -m 0644 "$REPO/systemd/broadcast.service" /etc/systemd/system/broadcast.service
install -D -m 0644 "$REPO/systemd/broadcast.sysusers" /usr/lib/sysusers.d/broadcast.conf
systemd-sysusers /usr/lib/sysusers.d/broadcast.conf
check "systemd-sysusers made the group broadcast" getent group broadcast
mkdir -p /etc/broadcast
echo "STREAM_KEY=$KEY" > /etc/broadcast/broadcast.env
chmod 0600 /etc/broadcast/broadcast.env
cat > /etc/broadcast/broadcast.toml <<CONF
[video]
source = "/dev/video0"
input = 0
size = "320x180"
fps = 15
[audio]
mic = "hw:Loopback,1,0"
[encoder]
preset = "ultrafast"
keyframe_interval = "1s"
[control]
socket = "/run/broadcast/control.sock"
socket_group = "broadcast"
socket_mode = "0660"
[[output]]
name = "rec"
path = "/var/lib/broadcast/rec-%Y%m%d-%H%M%S.mp4"
on_file_finished = ["/bin/sh", "-c", "echo \"\$1 \$(stat -c %s \"\$1\")\" >> /var/lib/broadcast/hook-ran.txt", "hook", "{path}"]
[[output]]
name = "live"
url = "rtmp://127.0.0.1/live/\${STREAM_KEY}"
CONF
systemctl daemon-reload
useradd --system --no-create-home --shell /usr/sbin/nologin -G broadcast bcmember
useradd --system --no-create-home --shell /usr/sbin/nologin bcstranger

ts "2. a tone into snd-aloop, nginx-rtmp listening"
ffmpeg -hide_banner -nostdin -loglevel error -f lavfi -i "sine=frequency=1000:sample_rate=48000:duration=120" -ac 2 -c:a pcm_s16le /run/tone.wav
aplay -q -D hw:Loopback,0,0 /run/tone.wav &
player=$!
check "tone playing into hw:Loopback,0,0" wait_playback
mkdir -p /run/nginx /run/nginx-rec
cat > /run/nginx/nginx.conf <<CONF
load_module /usr/lib/nginx/modules/ngx_rtmp_module.so;
daemon off;
master_process off;
user root;
pid /run/nginx/nginx.pid;
error_log /run/nginx/error.log info;
events { worker_connections 64; }
rtmp {
    server {
        listen 127.0.0.1:1935;
        application live { live on; record all; record_path /run/nginx-rec; record_suffix .flv; record_unique off; }
    }
}
CONF
/usr/sbin/nginx -c /run/nginx/nginx.conf -p /run/nginx -e /run/nginx/error.log &
nginx=$!
for _ in $(seq 300); do bash -c "(exec 3<>/dev/tcp/127.0.0.1/1935)" 2>/dev/null && break; sleep 0.1; done
check "nginx-rtmp listening on 127.0.0.1:1935" bash -c '(exec 3<>/dev/tcp/127.0.0.1/1935)'

ts "3. systemctl start broadcast (Type=notify: returns once the daemon said READY=1)"
systemctl start broadcast; rc=$?
journal
check "systemctl start broadcast succeeded" [ "$rc" = 0 ]
check "broadcast.service is active" sh -c '[ "$(systemctl is-active broadcast)" = active ]'
pid=$(systemctl show -p MainPID --value broadcast)
echo "MainPID $pid; $(grep -E '^(Uid|Gid|Groups|NoNewPrivs|Seccomp|CapBnd|CapEff):' /proc/$pid/status 2>/dev/null | tr -s '\t ' ' ' | tr '\n' ';')"
check "the daemon runs with a seccomp filter and no new privileges (the unit's sandbox applied)" \
    sh -c "grep -q '^Seccomp:[[:space:]]*2' /proc/$pid/status && grep -q '^NoNewPrivs:[[:space:]]*1' /proc/$pid/status"
check "the daemon runs as a dynamic user, not root" sh -c "[ ${pid:-0} -gt 0 ] && [ \"\$(stat -c %u /proc/$pid)\" != 0 ]"
systemd-analyze security --no-pager broadcast.service > security.txt 2>&1
grep Overall security.txt
/usr/local/bin/broadcast status --json --socket /run/broadcast/control.sock > status-root.json 2> status-root.err
check "broadcast status (root) answers over the control socket" contains status-root.json '"state":"started"'
check "status: the microphone (snd-aloop) and the video (vivid) capturing, both outputs up" \
    sh -c 'grep -q "\"audioMic\":{\"source_state\":\"capturing\"" status-root.json && grep -q "\"video\":{\"source_state\":\"capturing\"" status-root.json &&
        grep -q "\"name\":\"rec\",[^}]*\"state\":\"recording\"" status-root.json && grep -q "\"name\":\"live\",[^}]*\"state\":\"live\"" status-root.json'
ls -l /run/broadcast/ | tr -s ' ' | cut -d' ' -f1,3,4,9 | tr '\n' ' '; echo
runuser -u bcmember -- /usr/local/bin/broadcast status --json --socket /run/broadcast/control.sock > status-member.json 2> status-member.err
check "a member of the group broadcast gets the status ($(head -c 200 status-member.err))" contains status-member.json '"state":"started"'
runuser -u bcstranger -- /usr/local/bin/broadcast status --json --socket /run/broadcast/control.sock > status-stranger.json 2> status-stranger.err
check "a user outside the group is refused by the socket's mode ($(head -c 200 status-stranger.err))" \
    sh -c '! grep -q "\"state\"" status-stranger.json && grep -q "Permission denied" status-stranger.err'

ts "4. recording and streaming for a while, then systemctl reload (SIGHUP)"
sleep 6
systemctl reload broadcast; rc=$?
for _ in $(seq 300); do journal; grep -q 'SIGHUP: config reloaded' journal.txt && break; sleep 0.1; done
check "systemctl reload succeeded" [ "$rc" = 0 ]
check "the daemon reloaded its config on SIGHUP" contains journal.txt 'SIGHUP: config reloaded'
sleep 4
check "broadcast.service still active after the reload, same process" \
    sh -c "[ \"\$(systemctl is-active broadcast)\" = active ] && [ \"\$(systemctl show -p MainPID --value broadcast)\" = $pid ]"
/usr/local/bin/broadcast status --json --socket /run/broadcast/control.sock > status-late.json 2>&1
check "no restart (watchdog or failure) while it ran" sh -c "[ \"\$(systemctl show -p NRestarts --value broadcast)\" = 0 ]"
active_before_stop=$(systemctl is-active broadcast)

ts "5. systemctl stop broadcast"
systemctl stop broadcast; rc=$?
journal
check "systemctl stop succeeded" [ "$rc" = 0 ]
result=$(systemctl show -p Result --value broadcast); status=$(systemctl show -p ExecMainStatus --value broadcast)
check "the running service ended cleanly (was $active_before_stop; Result=$result, exit status $status)" \
    sh -c "[ '$active_before_stop' = active ] && [ '$result' = success ] && [ '$status' = 0 ]"
kill $player 2>/dev/null; wait $player 2>/dev/null
kill $nginx 2>/dev/null; wait $nginx 2>/dev/null
grep -vE '^$' journal.txt | tail -25

ts "6. what the service left"
ls -la /var/lib/private/broadcast/ 2>&1
rec=$(ls /var/lib/private/broadcast/rec-*.mp4 2>/dev/null | head -1)
[ -n "$rec" ] && cp "$rec" rec.mp4
n=$(frames rec.mp4); v=$(loudness rec.mp4)
echo "recording $rec: $n frames, max_volume ${v:-?} dB"
check "the recording is in /var/lib/broadcast (StateDirectory)" [ -n "$rec" ]
check "the recording decodes cleanly" clean rec.mp4 rec.decode.log
check "the recording has video (${n:-0} frames from vivid)" [ "${n:-0}" -gt 0 ]
check "the recording has the tone from snd-aloop, not silent (max ${v:-?} dB)" sh -c "[ -n '$v' ] && [ \$(echo '$v > -30' | bc) = 1 ]"
flv=$(ls /run/nginx-rec/*.flv 2>/dev/null | head -1)
[ -n "$flv" ] && cp "$flv" stream.flv
ns=$(frames stream.flv); vs=$(loudness stream.flv)
echo "nginx's copy of the stream $flv: $ns frames, max_volume ${vs:-?} dB"
check "the stream arrived at nginx-rtmp under the key from broadcast.env" [ "$flv" = "/run/nginx-rec/$KEY.flv" ]
check "the stream decodes cleanly" clean stream.flv stream.decode.log
check "the stream has video and the tone (${ns:-0} frames, ${vs:-?} dB)" \
    sh -c "[ ${ns:-0} -gt 0 ] && [ -n '$vs' ] && [ \$(echo '$vs > -30' | bc) = 1 ]"
cat /var/lib/private/broadcast/hook-ran.txt 2>&1
check "the on_file_finished hook ran for the recording" \
    sh -c "[ -n '$rec' ] && grep -q \"^/var/lib/broadcast/\$(basename '$rec') [1-9]\" /var/lib/private/broadcast/hook-ran.txt"
check "the stream key is in no log line (journal)" sh -c "! grep -q '$KEY' journal.txt"
check "the journal names the stream with its key masked" contains journal.txt 'rtmp://127.0.0.1/live/\*\*\*\*'
# libdispatch's worker threads ask setpriority() for their QoS and log errno=1 when refused (once
# without any system call filter too: raising a priority needs CAP_SYS_NICE); not the daemon's.
echo "INFO: libdispatch refused a thread priority $(grep -c 'Failed to set thread priority' journal.txt) time(s)"
check "no 'Operation not permitted' or 'Permission denied' in the journal" sh -c "! grep -qE 'Operation not permitted|Permission denied' journal.txt"

echo
ts "done"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
