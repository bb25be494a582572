#!/usr/bin/env bash
# A headless Linux desktop for the tests: a private D-Bus session bus, PipeWire + WirePlumber
# (+ pipewire-pulse), sway on the headless backend with the pixman renderer, and
# xdg-desktop-portal with the wlr backend (no chooser: the one output is cast).
#
#   scripts/desktop-session.sh start DIR    start it all under DIR, write DIR/env.sh
#   scripts/desktop-session.sh stop DIR     stop exactly what `start` started (by process group)
#
# Knobs (environment):
#   DESKTOP_SIZE=1280x720      the output's size
#   DESKTOP_BG=#ff0000         the background colour (change it later: swaymsg output HEADLESS-1 bg '#00ff00' solid_color)
#   DESKTOP_COMPOSITOR=1       0: PipeWire only (audio tests), no sway and no portal
#   DESKTOP_PORTAL=1           0: no xdg-desktop-portal (tests of "no portal answers")
#   DESKTOP_ACTIVITY=0         1: a small terminal (160x40 at 0,0) counting 30 times a second, so the
#                              cast keeps sending frames (the portal sends a frame only on damage)
#   DESKTOP_MAX_FPS=30         the portal's frame-rate ceiling
#
# Audio devices (a PipeWire drop-in): `test_sink`, a null sink and the default sink (desktop audio
# is its monitor); `test_mic`, the default source, which plays what is played into the sink
# `test_mic_input` (so a test can "speak into the microphone").
#
# Debian 12 specifics this handles (each cost someone an afternoon):
# - sway 1.7 will not run as root: it runs in a user namespace as uid 1000 (no account needed).
# - xdg-desktop-portal-wlr 0.7 cannot start a cast on the pixman renderer: a preloaded library
#   (scripts/desktop/xdpw-shm-format.c, built here with gcc) fixes the format announcement.
# - The session bus activates nothing (empty service directory): Debian's session bus would
#   otherwise start xdg-document-portal, whose FUSE mount blocks removing DIR.
# - PID 1 may not reap orphans: "alive" means the process exists and is not a zombie.
# - Processes started by a test may inherit blocked signals, so stop escalates to SIGKILL.
set -euo pipefail

# Close every inherited descriptor but the standard three, so the daemons started here hold none of
# the caller's: a parent that waits for a pipe or socket to close (Foundation's Process does) would
# otherwise wait for as long as the desktop runs.
for fd in /proc/$$/fd/*; do
    fd=${fd##*/}
    [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null || true
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command=${1:-}
dir=${2:-}
[ -n "$command" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

size=${DESKTOP_SIZE:-1280x720}
background=${DESKTOP_BG:-#ff0000}
compositor=${DESKTOP_COMPOSITOR:-1}
portal=${DESKTOP_PORTAL:-1}
activity=${DESKTOP_ACTIVITY:-0}
max_fps=${DESKTOP_MAX_FPS:-30}
[ "$compositor" = 1 ] || { portal=0; activity=0; }

started=$(date +%s%N)
say() { printf '[desktop %5d ms] %s\n' $(( ($(date +%s%N) - started) / 1000000 )) "$*" >&2; }
fail() { say "failed: $*"; exit 1; }

alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# until SECONDS WHAT COMMAND...: polls COMMAND every 20 ms.
until_ready() {
    local seconds=$1 what=$2; shift 2
    local deadline=$(( $(date +%s) + seconds ))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "$what not ready after ${seconds} s (logs in $dir/logs)"
        sleep 0.02
    done
    say "ready: $what"
}

# launch NAME COMMAND...: in a session of its own (stop signals the whole group), logged to logs/NAME.log.
launch() {
    local name=$1; shift
    setsid "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
    echo "$! $name" >>"$dir/processes"
}

stop() {
    [ -f "$dir/processes" ] || return 0
    local entries pid name
    mapfile -t entries < <(tac "$dir/processes")
    for entry in "${entries[@]}"; do
        read -r pid name <<<"$entry"
        alive "$pid" && { kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; }
    done
    for entry in "${entries[@]}"; do
        read -r pid name <<<"$entry"
        for _ in $(seq 50); do alive "$pid" || break; sleep 0.02; done
        alive "$pid" && { kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; }
    done
    if mountpoint -q "$dir/run/doc" 2>/dev/null; then umount -l "$dir/run/doc" || true; fi
    rm -rf "$dir/run" "$dir/processes" "$dir/env.sh"
}

case "$command" in
    stop) stop; exit 0 ;;
    start) ;;
    *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac

[ -f "$dir/processes" ] && fail "a session is already running in $dir ($0 stop $dir)"
trap 'status=$?; [ $status -eq 0 ] || { say "stopping what was started"; stop; }' EXIT
rm -rf "$dir/run" "$dir/state" "$dir/data" "$dir/logs"
mkdir -p "$dir/logs" "$dir/config/pipewire/pipewire.conf.d" "$dir/state" "$dir/data" "$dir/services"
mkdir -m 0700 "$dir/run"
: >"$dir/processes"

export XDG_RUNTIME_DIR=$dir/run XDG_CONFIG_HOME=$dir/config XDG_STATE_HOME=$dir/state XDG_DATA_HOME=$dir/data
export DBUS_SESSION_BUS_ADDRESS=unix:path=$dir/run/bus
export GSETTINGS_BACKEND=memory LANG=C.UTF-8
unset WAYLAND_DISPLAY DISPLAY SWAYSOCK PIPEWIRE_REMOTE PULSE_SERVER

# --- session bus ---------------------------------------------------------------------------
cat >"$dir/bus.conf" <<EOF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path=$dir/run/bus</listen>
  <auth>EXTERNAL</auth>
  <servicedir>$dir/services</servicedir>
  <policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy>
</busconfig>
EOF
launch bus dbus-daemon --nofork --nopidfile --config-file="$dir/bus.conf"
bus() { dbus-send --session --print-reply --dest="$1" "${@:2}"; }
has_owner() { bus org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus.NameHasOwner "string:$1" | grep -q 'boolean true'; }
until_ready 5 "session bus" bus org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus.GetId

# --- PipeWire --------------------------------------------------------------------------------
cat >"$dir/config/pipewire/pipewire.conf.d/50-broadcast-tests.conf" <<'EOF'
context.objects = [
  { factory = adapter
    args = { factory.name = support.null-audio-sink  node.name = "test_sink"
             node.description = "Test sink (desktop audio)"  media.class = "Audio/Sink"
             audio.position = [ FL FR ]  monitor.channel-volumes = true
             priority.session = 2000  priority.driver = 2000 } }
]
context.modules = [
  { name = libpipewire-module-loopback
    args = { node.description = "Test microphone"  audio.position = [ MONO ]
             capture.props  = { node.name = "test_mic_input"  media.class = "Audio/Sink"    priority.session = 100 }
             playback.props = { node.name = "test_mic"        media.class = "Audio/Source"  priority.session = 2000 } } }
]
EOF
launch pipewire pipewire
until_ready 5 "PipeWire" test -S "$dir/run/pipewire-0"
launch wireplumber wireplumber
launch pipewire-pulse pipewire-pulse
until_ready 10 "WirePlumber (default sink test_sink)" sh -c 'pw-metadata -n default 0 default.audio.sink | grep -q test_sink'
until_ready 5 "pipewire-pulse" pactl info

environment="export XDG_RUNTIME_DIR='$XDG_RUNTIME_DIR'
export XDG_CONFIG_HOME='$XDG_CONFIG_HOME'
export XDG_STATE_HOME='$XDG_STATE_HOME'
export XDG_DATA_HOME='$XDG_DATA_HOME'
export DBUS_SESSION_BUS_ADDRESS='$DBUS_SESSION_BUS_ADDRESS'
export PULSE_SERVER='unix:$XDG_RUNTIME_DIR/pulse/native'
export GSETTINGS_BACKEND=memory"

# --- sway -----------------------------------------------------------------------------------
if [ "$compositor" = 1 ]; then
    width=${size%x*} height=${size#*x}
    cat >"$dir/sway.conf" <<EOF
xwayland disable
output HEADLESS-1 resolution ${width}x${height} position 0,0 bg $background solid_color
default_border none
default_floating_border none
seat * hide_cursor 100
for_window [app_id="activity"] floating enable, resize set 160 40, move position 0 0
EOF
    unshare --user --map-user=1000 --map-group=1000 true 2>/dev/null \
        || fail "user namespaces are not allowed here, and sway 1.7 refuses to run as root"
    launch sway env WLR_BACKENDS=headless WLR_RENDERER=pixman WLR_LIBINPUT_NO_DEVICES=1 \
        unshare --user --map-user=1000 --map-group=1000 sway -c "$dir/sway.conf"
    until_ready 10 "Wayland socket" sh -c "ls '$dir/run'/wayland-[0-9]"
    export WAYLAND_DISPLAY=$(basename "$(ls "$dir/run"/wayland-[0-9] | head -n 1)")
    sway_pid=$(awk '$2 == "sway" {print $1}' "$dir/processes")
    export SWAYSOCK=$dir/run/sway-ipc.1000.$sway_pid.sock
    until_ready 10 "sway IPC" sh -c 'swaymsg -t get_outputs -r | grep -q HEADLESS-1'
    until_ready 10 "background painted" sh -c \
        "grim -g '$((width / 2)),$((height / 2)) 1x1' -t ppm - | tail -c 3 | od -An -tx1 | tr -d ' \n' | grep -qix '${background#\#}'"
    if [ "$activity" = 1 ]; then
        launch activity foot --app-id activity -o colors.background=000000 \
            sh -c 'i=0; while :; do printf "\r%08d" $i; i=$((i + 1)); sleep 0.033; done'
        until_ready 10 "activity window" sh -c 'swaymsg -t get_tree | grep -q "\"app_id\": \"activity\""'
    fi
    environment="$environment
export WAYLAND_DISPLAY='$WAYLAND_DISPLAY'
export SWAYSOCK='$SWAYSOCK'
export XDG_SESSION_TYPE=wayland
export XDG_CURRENT_DESKTOP=sway"
fi

# --- portal -----------------------------------------------------------------------------------
if [ "$portal" = 1 ]; then
    preload=$dir/xdpw-shm-format.so
    gcc -shared -fPIC -O2 -o "$preload" "$here/desktop/xdpw-shm-format.c" -ldl || fail "cannot build $preload"
    printf '[screencast]\noutput_name=HEADLESS-1\nchooser_type=none\nmax_fps=%s\n' "$max_fps" >"$dir/xdpw.conf"
    export XDG_CURRENT_DESKTOP=sway   # xdg-desktop-portal 1.16 chooses the wlr backend by UseIn=sway
    launch portal-wlr env LD_PRELOAD="$preload" /usr/libexec/xdg-desktop-portal-wlr -l INFO -c "$dir/xdpw.conf"
    until_ready 10 "portal backend (wlr)" has_owner org.freedesktop.impl.portal.desktop.wlr
    # The permission store keeps the portal's restore data (on disk, under XDG_DATA_HOME), as on a
    # real desktop where the bus activates it; without it xdg-desktop-portal keeps it in memory only.
    launch permission-store /usr/libexec/xdg-permission-store --replace
    until_ready 10 "permission store" has_owner org.freedesktop.impl.portal.PermissionStore
    launch portal /usr/libexec/xdg-desktop-portal -v
    until_ready 15 "ScreenCast portal" sh -c "dbus-send --session --print-reply --dest=org.freedesktop.portal.Desktop \
        /org/freedesktop/portal/desktop org.freedesktop.DBus.Properties.Get \
        string:org.freedesktop.portal.ScreenCast string:version | grep -q uint32"
fi

printf '%s\n' "$environment" >"$dir/env.sh"
trap - EXIT
say "desktop up; environment in $dir/env.sh"
