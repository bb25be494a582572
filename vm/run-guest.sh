#!/bin/bash
# vm/run-guest.sh - broadcast's VM harness (adapted from the team's ../shared/vm recipe): boot Debian's own kernel (linux-image-amd64, never installed on
# the host) in QEMU with a tiny busybox initramfs, share the host's / into the
# guest over virtio-9p (read-only, with a throw-away tmpfs overlay on top), load
# the real vivid + snd-aloop modules there and run a script chrooted into the
# host's root, so host binaries (v4l2-ctl, ffmpeg, arecord, your build, ...) run
# unchanged against /dev/video* and /dev/snd/*.
#
# usage: run-guest.sh [GUEST_SCRIPT]      (default: guest-tests.sh beside this script)
#        GUEST_ENV="K=V ..."  written to $OUT/env.sh, which the guest script may source
# env:   ACCEL=auto|tcg|kvm  auto = kvm only with kvm_intel/kvm_amd, else tcg
#                        (a kvm_pvm /dev/kvm, as on this host, can't boot a stock kernel)
#        TCG_CPU=max     -cpu model under TCG
#        SMP=2 MEM=1024  guest vCPUs / MiB
#        OUT=/tmp/broadcast-vm/out  results dir on the host (wiped), = /tmp/out in the guest
#        VMH=/var/cache/broadcast-vm  cache dir kept between runs (kernel .deb, unpacked tree, initrd)
#        KPKG=linux-image-6.1.0-NN-amd64  default: what linux-image-amd64 depends on
#        KBOOT=vmlinux|bzimage  vmlinux (default) = PVH ELF entry, skips the xz
#                        decompressor (~5 s faster under TCG)
#        GUEST_MODULES="vivid n_devs=1;snd-aloop index=0 pcm_substreams=2"
#                        ';'-separated "module [options]" loaded with modprobe
#                        before the script (the guest script may rmmod/modprobe too)
#        KAPPEND=quiet   extra kernel command line ("quiet vmh.root=ro" = no overlay:
#                        read-only host root, tmpfs /tmp, host /tmp at /run/hosttmp)
#        QEMU_TIMEOUT=600 LIVE=1 (copy guest script output to the console live)
#        VM_INIT=chroot  chroot = run the script chrooted into the overlay (busybox is PID 1);
#                        systemd = switch_root into the overlay and boot the host's
#                        /lib/systemd/systemd as PID 1, which runs the script as the
#                        oneshot vmh-guest.service (target vmh-guest.target: sysinit,
#                        sockets and udev, no timers or getty), then powers off. For tests
#                        of systemd units under real systemd (vm/guest-systemd.sh). The boot
#                        empties /tmp (tmpfiles' "D /tmp"; /tmp/out stays): hand in no /tmp paths.
#        VM_NICE=-10     qemu's nice value (negative only as root; 0 = as the caller).
#                        The emulated machine is test equipment: a real capture box's
#                        CPU is not time-shared with the host's other work, so qemu runs
#                        ahead of ordinary processes (a CI host's builds, a load test's
#                        busy loops), or TCG's software floating point leaves the guest
#                        too slow to encode audio in real time (vm/README.md, "Under load")
# In the guest the script runs as root, chrooted into an overlay of the host's /
# (writes go to guest RAM and vanish), cwd /tmp/out (= $OUT, read-write 9p).
# (VM_INIT=systemd: the same root, booted; the script runs as a service of PID 1.)
# Its stdout+stderr land in $OUT/guest.log, exit code in $OUT/rc; the exit code
# of run-guest.sh is that rc (or 1xx/124 for boot problems/timeouts).
set -euo pipefail

SELF=$(readlink -f "$0")
VMH=${VMH:-/var/cache/broadcast-vm}
OUT=$(readlink -m "${OUT:-/tmp/broadcast-vm/out}")
GUEST_SCRIPT=$(readlink -f "${1:-$(dirname "$SELF")/guest-tests.sh}")
ACCEL=${ACCEL:-auto}
SMP=${SMP:-2}
MEM=${MEM:-1024}
KBOOT=${KBOOT:-vmlinux}
QEMU_TIMEOUT=${QEMU_TIMEOUT:-600}
LIVE=${LIVE:-1}
GUEST_MODULES=${GUEST_MODULES:-vivid n_devs=1;snd-aloop index=0 pcm_substreams=2}
VM_INIT=${VM_INIT:-chroot}
case $VM_INIT in chroot|systemd) ;; *) echo "VM_INIT=$VM_INIT: chroot or systemd" >&2; exit 2 ;; esac
T0=$(date +%s.%N)
[ -f "$GUEST_SCRIPT" ] || { echo "no guest script $GUEST_SCRIPT" >&2; exit 2; }
mkdir -p "$VMH"
cd "$VMH"

# ---------------------------------------------------------------- kernel ---
# 1. fetch Debian's kernel .deb (NOT installed on the host) and unpack it
if [ ! -f "$VMH/kernel.ok" ]; then
    resolve() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
    KPKG=${KPKG:-$(resolve)}
    [ -n "$KPKG" ] || { apt-get update -qq && KPKG=$(resolve); }
    [ -n "$KPKG" ] || { echo "cannot resolve linux-image-amd64 (run apt-get update)" >&2; exit 1; }
    rm -rf "$VMH/kpkg" "$VMH"/linux-image-*.deb "$VMH/vmlinux"
    # (as root into a dir _apt can't write, apt-get warns "Download is performed unsandboxed": harmless)
    apt-get download "$KPKG" 2> >(grep -v 'performed unsandboxed' >&2)
    dpkg -x "$VMH/$KPKG"_*.deb "$VMH/kpkg"
    KV=$(ls "$VMH/kpkg/lib/modules")
    depmod -b "$VMH/kpkg" "$KV"          # the .deb ships no modules.dep/.alias
    # PVH-bootable ELF: pull the xz-compressed vmlinux out of the bzImage
    python3 - "$VMH/kpkg/boot/vmlinuz-$KV" "$VMH/vmlinux" <<'EOF'
import lzma, sys
d = open(sys.argv[1], 'rb').read()
i = d.find(b'\xfd7zXZ\x00')
while i >= 0:
    try:
        out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(d[i:])
        if out[:4] == b'\x7fELF':
            open(sys.argv[2], 'wb').write(out); sys.exit(0)
    except lzma.LZMAError:
        pass
    i = d.find(b'\xfd7zXZ\x00', i + 1)
sys.exit("no xz-compressed ELF found in bzImage")
EOF
    echo "$KV" > "$VMH/kernel.ok"
fi
KV=$(cat "$VMH/kernel.ok")
MODDIR=$VMH/kpkg/lib/modules/$KV

# ------------------------------------------------------------- initramfs ---
# 2. tiny initramfs: static busybox + virtio-pci/9p/overlay .ko files + /init.
#    vivid, snd-aloop & deps are modprobe'd later from the unpacked tree via 9p.
# Named by this script's hash: runs of other versions of it sharing $VMH (other branches) each
# keep their own initrd instead of rebuilding one file under each other's running qemu.
INITRD=$VMH/initrd-$(sha256sum "$SELF" | cut -c1-16).cpio
if [ ! -f "$INITRD" ]; then
    R=$VMH/initramfs-$$
    rm -rf "$R"; mkdir -p "$R"/{bin,proc,sys,dev,host,lower,rw,lib/modules}
    cp /bin/busybox "$R/bin/busybox"          # Debian busybox-static
    : > "$R/modules.list"
    for m in virtio_pci 9pnet_virtio 9p overlay; do   # load order from modprobe itself
        modprobe -d "$VMH/kpkg" -S "$KV" --show-depends "$m" | awk '$1=="insmod"{print $2}'
    done | awk '!seen[$0]++' | while read -r ko; do
        cp "$ko" "$R/lib/modules/"; basename "$ko" >> "$R/modules.list"
    done
    cat > "$R/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
log() { echo "vmh: [$(cut -d' ' -f1 /proc/uptime)s] $*"; }
die() { log "FATAL: $*"; echo o > /proc/sysrq-trigger; sleep 5; poweroff -f; }
log "init started"
KMOD=; LIVE=1; ROOT=overlay; INIT=chroot
for a in $(cat /proc/cmdline); do
    case $a in vmh.kmod=*) KMOD=${a#vmh.kmod=} ;; vmh.live=*) LIVE=${a#vmh.live=} ;; vmh.root=*) ROOT=${a#vmh.root=} ;;
               vmh.init=*) INIT=${a#vmh.init=} ;; esac
done
while read -r ko; do insmod "/lib/modules/$ko" || log "insmod $ko FAILED"; done < /modules.list
O9P="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$O9P,ro,cache=loose" hostroot /lower || die "mount hostroot"
mount -t tmpfs -o mode=755 tmpfs /rw && mkdir -p /rw/upper /rw/work
if [ "$ROOT" != ro ] && mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /host; then
    ROOTMODE=overlay
else   # fallback: read-only host root, tmpfs /tmp (host /tmp visible at /run/hosttmp)
    ROOTMODE=ro; mount -o bind /lower /host
fi
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /host/dev/pts
mount -t tmpfs tmpfs /host/dev/shm
mount -t tmpfs tmpfs /host/run
if [ $ROOTMODE = ro ]; then
    mkdir -p /host/run/hosttmp; mount -o bind /lower/tmp /host/run/hosttmp
    mount -t tmpfs tmpfs /host/tmp
fi
mkdir -p /host/tmp/out
mount -t 9p -o "$O9P,cache=none" out /host/tmp/out || die "mount out"
# Debian module tree for modprobe in the chroot: /run/kroot always (modprobe -d),
# and the normal /lib/modules/$(uname -r) when the root is writable (overlay)
KV=$(uname -r)
mkdir -p /host/run/kroot/lib/modules/$KV
mount -o bind "/lower$KMOD" /host/run/kroot/lib/modules/$KV || log "no module tree at $KMOD"
[ $ROOTMODE = overlay ] && mkdir -p /host/lib/modules/$KV && mount -o bind "/lower$KMOD" /host/lib/modules/$KV
log "root=$ROOTMODE; loading guest modules"
IFS=';'; for spec in $(cat /host/tmp/out/.vmh-modules 2>/dev/null); do
    IFS=' '; [ -n "$spec" ] && { chroot /host /sbin/modprobe -d /run/kroot $spec || log "modprobe $spec FAILED"; }
done; IFS=' '
if [ "$INIT" = systemd ]; then
    [ $ROOTMODE = overlay ] || die "vmh.init=systemd needs the overlay root"
    # The script as a oneshot service of the booted system (the kernel command line names the
    # target: systemd.unit=vmh-guest.target). Written into the overlay's /etc: guest RAM only.
    U=/host/etc/systemd/system
    cat > $U/vmh-guest.target <<'UNIT'
[Unit]
Description=vmh: run the guest script
Requires=vmh-guest.service
After=vmh-guest.service
AllowIsolate=yes
UNIT
    if [ "$LIVE" = 1 ]; then TO='2>&1 | tee guest.log > /dev/console'; else TO='> guest.log 2>&1'; fi
    cat > $U/vmh-guest.service <<UNIT
[Unit]
Description=vmh: the guest script /tmp/out/cmd.sh
After=basic.target systemd-udev-trigger.service
SuccessAction=poweroff-force
FailureAction=poweroff-force
[Service]
Type=oneshot
WorkingDirectory=/tmp/out
Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp TERM=dumb LANG=C.UTF-8
ExecStart=/bin/bash -c 'set -o pipefail; { if head -c2 cmd.sh | grep -q "#!"; then ./cmd.sh; else /bin/sh ./cmd.sh; fi; } $TO; echo \$\$? > rc; sync'
StandardOutput=journal+console
TimeoutStartSec=infinity
UNIT
    # Only what a service needs: no timers (apt-daily would start apt in the guest), no NTP.
    for unit in timers.target systemd-timesyncd.service getty.target; do ln -sf /dev/null $U/$unit; done
    # A host that is a container has /.dockerenv: systemd would take the VM for a container
    # ("Detected virtualization docker") and skip what only a real machine does.
    rm -f /host/.dockerenv
    log "switch_root: systemd as PID 1, systemd.unit=vmh-guest.target"
    exec switch_root /host /lib/systemd/systemd --unit=vmh-guest.target --show-status=error
fi
log "running /tmp/out/cmd.sh"
CMD='cd /tmp/out && if head -c2 cmd.sh | grep -q "#!"; then exec ./cmd.sh; else exec /bin/sh ./cmd.sh; fi'
set -o pipefail
if [ "$LIVE" = 1 ]; then
    chroot /host /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/tmp TERM=dumb LANG=C.UTF-8 /bin/sh -c "$CMD" 2>&1 | tee /host/tmp/out/guest.log
else
    chroot /host /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/tmp TERM=dumb LANG=C.UTF-8 /bin/sh -c "$CMD" > /host/tmp/out/guest.log 2>&1
fi
rc=$?
echo "$rc" > /host/tmp/out/rc
log "guest script exited rc=$rc"
sync; umount /host/tmp/out
poweroff -f
EOF
    chmod +x "$R/init"
    (cd "$R" && find . | cpio -o -H newc --quiet) > "$INITRD.$$"
    mv "$INITRD.$$" "$INITRD"; rm -rf "$R"
fi

# ------------------------------------------------------------------ run ---
rm -rf "$OUT"; mkdir -p "$OUT"
cp "$GUEST_SCRIPT" "$OUT/cmd.sh"; chmod +x "$OUT/cmd.sh"
printf '%s\n' ${GUEST_ENV:-} > "$OUT/env.sh"
printf '%s' "$GUEST_MODULES" > "$OUT/.vmh-modules"

if [ "$ACCEL" = auto ]; then
    # real hardware KVM only (kvm_intel/kvm_amd). A kvm_pvm /dev/kvm (nested
    # "Process VM" KVM) cannot run a stock kernel: "KVM internal error.
    # Suberror: 1 / emulation failure" on cmpxchg16b/xrstor/int3, VM hangs.
    if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
        ACCEL=kvm; else ACCEL=tcg; fi
fi
case $ACCEL in
    kvm) ACCEL_OPTS=(-accel kvm -cpu host) ;;
    *)   ACCEL_OPTS=(-accel tcg,thread=multi,tb-size=256 -cpu "${TCG_CPU:-max}") ;;
esac
case $KBOOT in
    vmlinux) KIMG=$VMH/vmlinux ;;                  # PVH entry, no decompression
    *)       KIMG=$VMH/kpkg/boot/vmlinuz-$KV ;;   # classic bzImage
esac

VM_NICE=${VM_NICE:--10}
NICE=()
if [ "$VM_NICE" != 0 ] && { [ "$VM_NICE" -gt 0 ] || [ "$(id -u)" = 0 ]; }; then NICE=(nice -n "$VM_NICE"); fi
echo "vmh: qemu at nice ${NICE[2]:-$(nice)}"

SYSTEMD_ARGS=
[ "$VM_INIT" = systemd ] && SYSTEMD_ARGS="systemd.unit=vmh-guest.target systemd.show_status=error"   # also as arguments (switch_root)
T1=$(date +%s.%N)
set +e
timeout "$QEMU_TIMEOUT" "${NICE[@]}" qemu-system-x86_64 \
    "${ACCEL_OPTS[@]}" -machine pc -smp "$SMP" -m "$MEM" \
    -nodefaults -no-user-config -display none -no-reboot \
    -chardev stdio,id=ser0,signal=on -serial chardev:ser0 -monitor none \
    -kernel "$KIMG" -initrd "$INITRD" \
    -append "console=ttyS0 panic=-1 mitigations=off vmh.kmod=$MODDIR vmh.live=$LIVE vmh.init=$VM_INIT $SYSTEMD_ARGS ${KAPPEND:-quiet}" \
    -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev local,id=out,path="$OUT",security_model=none \
    -device virtio-9p-pci,fsdev=out,mount_tag=out \
    < /dev/null 2>&1 | tee "$OUT/console.log"
qrc=${PIPESTATUS[0]}
set -e
T2=$(date +%s.%N)

if [ "$LIVE" != 1 ]; then
    echo "=================== guest.log ==================="; cat "$OUT/guest.log" 2>/dev/null || true
fi
grc=$(cat "$OUT/rc" 2>/dev/null || echo none)
printf 'vmh: qemu rc=%s guest rc=%s  qemu wall=%.1fs  total wall=%.1fs  (accel=%s, kernel=%s %s)\n' \
    "$qrc" "$grc" "$(echo "$T2 - $T1" | bc)" "$(echo "$T2 - $T0" | bc)" "$ACCEL" "$KBOOT" "$KV"
[ "$qrc" = 124 ] && exit 124
[ "$grc" = none ] && exit 100
exit "$grc"
