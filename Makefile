# broadcast — two entry points, both work as root on a fresh Debian 12:
#   make demo   record and stream the built-in test pattern and tone
#   make test   build and run every test
# Both install the Debian packages they need first (apt-get update only when something is missing).

SHELL := /bin/bash
SWIFT ?= swift
PREFIX ?= /usr/local
OUT ?= out
# Release builds carry the Swift runtime and Foundation inside the binary: an installed broadcast
# needs no Swift toolchain at run time, and only the parts it uses are loaded (~3 MB less RSS,
# fewer libraries for the dynamic linker at start-up).
RELEASE_BUILD := $(SWIFT) build -c release --static-swift-stdlib

# The Wayland desktop tests (scripts/desktop-session.sh): session bus, PipeWire + WirePlumber +
# pipewire-pulse, headless sway, the ScreenCast portal (wlr), gcc for its preloaded fix.
DESKTOP_APT_PACKAGES := dbus pipewire pipewire-bin wireplumber pipewire-pulse pulseaudio-utils \
                sway swaybg foot fonts-dejavu-core grim xdg-desktop-portal xdg-desktop-portal-wlr gcc libc6-dev
# Build needs: the C libraries' -dev packages. Tests and demo need: ffmpeg/ffprobe to check outputs,
# nginx with its RTMP module as a local streaming server, the Janus gateway (an SFU the WHIP output
# publishes into) and janus-tools (janus-pp-rec, to read what Janus recorded), srt-tools
# (srt-live-transmit, an SRT listener of libsrt's own).
APT_PACKAGES := pkg-config libsrt-gnutls-dev libgstreamer1.0-dev libgstreamer-plugins-bad1.0-dev gstreamer1.0-plugins-bad gstreamer1.0-nice gstreamer1.0-plugins-good libcurl4-gnutls-dev libavcodec-dev libavformat-dev libavutil-dev libswscale-dev \
                libswresample-dev libv4l-dev libasound2-dev ffmpeg nginx libnginx-mod-rtmp libnginx-mod-stream openssl srt-tools janus janus-tools \
                libxcb1-dev libxcb-shm0-dev libxcb-xfixes0-dev libxcb-damage0-dev xvfb x11-apps \
                libpipewire-0.3-dev libsystemd-dev libwebrtc-audio-processing-dev strace chromium chromium-driver python3-venv python3-pip \
                $(DESKTOP_APT_PACKAGES)

.PHONY: deps deps-apt deps-python build release demo test test-unit docs clean vm-deps vm-test vm-test-systemd unit-security install

deps: deps-apt deps-python
	@command -v $(SWIFT) >/dev/null || { echo "swift not found: install a Swift 6 toolchain (swift.org) and put it on PATH"; exit 1; }

deps-apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# The WHIP tests' WebRTC peer (scripts/whip-endpoint.py): aiortc and aiohttp from PyPI, in a
# virtualenv at $(WHIP_VENV) (the tests and benchmarks/glass.py look for it there and install
# nothing themselves). Made once: skipped while its python imports both.
WHIP_VENV := .build/whip-venv
deps-python: deps-apt
	@if ! $(WHIP_VENV)/bin/python -c 'import aiortc, aiohttp' 2>/dev/null; then \
		echo "installing aiortc and aiohttp into $(WHIP_VENV)"; \
		python3 -m venv $(WHIP_VENV) && $(WHIP_VENV)/bin/python -m pip install -q aiortc aiohttp \
			&& $(WHIP_VENV)/bin/python -c 'import aiortc, aiohttp'; \
	fi

build: deps
	$(SWIFT) build

release: deps
	$(RELEASE_BUILD) --product broadcast
	$(RELEASE_BUILD) --product level-meter

demo: release
	@mkdir -p $(OUT)
	@echo "== the sample handler (samples/LevelMeter) on the test sources, 3 s =="
	$$($(RELEASE_BUILD) --show-bin-path)/level-meter 3
	@echo
	@echo "== recording 10 s of the test pattern and tone to $(OUT)/demo.mp4 =="
	$$($(RELEASE_BUILD) --show-bin-path)/broadcast record $(OUT)/demo.mp4 -y --video test --audio-mic test --duration 10s
	@echo
	@echo "Recorded $(abspath $(OUT))/demo.mp4"
	@echo "Play it with:  ffplay $(abspath $(OUT))/demo.mp4   (or mpv, vlc, a browser)"
	@echo
	@echo "== streaming 10 s to a local nginx-rtmp (started here, stopped after) while recording =="
	scripts/stream-demo.sh $$($(RELEASE_BUILD) --show-bin-path)/broadcast $(OUT) 10

test: deps
	$(SWIFT) build --build-tests
	@# The test bundle run directly (what `swift test` runs): under load `swift test`'s relay of
	@# its output dropped lines (test results, the closing summary), though its exit code was right.
	"$$($(SWIFT) build --show-bin-path)/broadcastPackageTests.xctest" --testing-library swift-testing 2>&1 | tee .test-output.log; exit $${PIPESTATUS[0]}
	$(MAKE) docs
	$(MAKE) vm-test

# BroadcastKit's documentation (DocC: the API and the article "Writing a broadcast handler"), built
# with warnings as errors so a renamed symbol or a broken link fails the tests.
docs:
	$(SWIFT) package --disable-sandbox generate-documentation --target BroadcastKit --warnings-as-errors

clean:
	rm -rf .build $(OUT)

# Device tests against real kernel drivers (vivid, snd-aloop) in a qemu VM: see vm/README.md.
# The kernel package is cached in $(VM_CACHE) between runs; the VM runs the host-built binary.
# udev: the systemd boot (vm/guest-systemd.sh) gives the capture devices their groups as a real
# system does (video, audio), or the service's DynamicUser= could not open them.
VM_APT_PACKAGES := qemu-system-x86 busybox-static cpio bc python3 kmod alsa-utils v4l-utils udev
VM_CACHE ?= /var/cache/broadcast-vm
VM_OUT ?= $(abspath $(OUT))/vm

vm-deps:
	@missing=$$(for p in $(VM_APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# Two boots: the device tests chrooted (vm/guest-tests.sh), then the daemon under its own unit with
# systemd as PID 1 (vm/guest-systemd.sh); both run, and either failing fails vm-test.
vm-test: deps vm-deps unit-security
	$(RELEASE_BUILD) --product broadcast
	VMH=$(VM_CACHE) OUT=$(VM_OUT) LIVE=1 QEMU_TIMEOUT=1200 \
		GUEST_ENV="BROADCAST=$$($(RELEASE_BUILD) --show-bin-path)/broadcast" \
		vm/run-guest.sh vm/guest-tests.sh; rc=$$?; \
	$(MAKE) --no-print-directory vm-test-systemd || rc=1; exit $$rc

# The daemon as systemd/broadcast.service runs it (its sandbox applied by a real systemd), capturing
# vivid and snd-aloop, recording, streaming, reloaded and stopped: see vm/README.md.
vm-test-systemd: vm-deps
	$(RELEASE_BUILD) --product broadcast
	VMH=$(VM_CACHE) OUT=$(VM_OUT)-systemd LIVE=1 QEMU_TIMEOUT=900 VM_INIT=systemd \
		GUEST_ENV="BROADCAST=$$($(RELEASE_BUILD) --show-bin-path)/broadcast REPO=$(CURDIR)" \
		vm/run-guest.sh vm/guest-systemd.sh

# The unit's sandbox stays tight: systemd-analyze's exposure score (0 = most, 10 = least
# restricted) at most 2.0. README, "Hardening", says what each setting protects.
unit-security:
	@systemd-analyze security --offline=yes --no-pager systemd/broadcast.service 2>&1 | grep 'Overall exposure'
	@systemd-analyze security --offline=yes --threshold=20 --no-pager systemd/broadcast.service > /dev/null 2>&1 \
		|| { echo "systemd/broadcast.service: exposure above 2.0 (systemd-analyze security --offline=yes systemd/broadcast.service)"; exit 1; }

# Benchmarks side by side with ffmpeg, and the one-hour soak: see benchmarks/README.md.
# make bench PAIRS=5 CASES=rec-720,offline-720,glass     make soak SOAK_SECONDS=600
.PHONY: bench bench-dip soak
PAIRS ?= 3
DIP_RUNS ?= 1
DIP_MODES ?= adaptive,fixed,ffmpeg
SOAK_SECONDS ?= 3600

bench: deps
	@command -v perf >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends linux-perf >/dev/null \
		|| echo "linux-perf could not be installed: the non-encoder overhead is skipped"
	$(RELEASE_BUILD) --product broadcast
	python3 benchmarks/bench.py --broadcast $$($(RELEASE_BUILD) --show-bin-path)/broadcast \
		--pairs $(PAIRS) --out $(OUT)/bench $(if $(CASES),--cases $(CASES))
	benchmarks/portal.sh $$($(RELEASE_BUILD) --show-bin-path)/broadcast 10 | tee $(OUT)/bench/portal.md
	case ",$(CASES)," in ",,"|*,glass,*) python3 benchmarks/glass.py --runs $(PAIRS) --out $(OUT)/glass \
		--broadcast $$($(RELEASE_BUILD) --show-bin-path)/broadcast;; *) echo "glass-to-glass: not in CASES";; esac

# A 3 Mbit/s stream through a 20 s dip of its path to 1.2 Mbit/s, with and without --adaptive and
# ffmpeg's plain stream (issue 36): benchmarks/dip.py, results in $(OUT)/dip.
bench-dip: deps
	$(RELEASE_BUILD) --product broadcast
	python3 benchmarks/dip.py --broadcast $$($(RELEASE_BUILD) --show-bin-path)/broadcast \
		--runs $(DIP_RUNS) --modes $(DIP_MODES) --out $(OUT)/dip

soak: deps
	$(RELEASE_BUILD) --product broadcast
	python3 benchmarks/soak.py --broadcast $$($(RELEASE_BUILD) --show-bin-path)/broadcast \
		--duration $(SOAK_SECONDS) --out $(OUT)/soak

# Puts the service in place: binary, unit, example config (kept if one exists), docs.
install: release
	install -D -m 0755 $$($(RELEASE_BUILD) --show-bin-path)/broadcast $(DESTDIR)$(PREFIX)/bin/broadcast
	install -D -m 0644 systemd/broadcast.service $(DESTDIR)/etc/systemd/system/broadcast.service
	install -D -m 0644 systemd/broadcast.sysusers $(DESTDIR)/usr/lib/sysusers.d/broadcast.conf
	@if [ -z "$(DESTDIR)" ]; then systemd-sysusers /usr/lib/sysusers.d/broadcast.conf 2>/dev/null || getent group broadcast >/dev/null || groupadd --system broadcast; fi
	sed -i 's|/usr/local/bin/broadcast|$(PREFIX)/bin/broadcast|' $(DESTDIR)/etc/systemd/system/broadcast.service
	@if [ -e $(DESTDIR)/etc/broadcast/broadcast.toml ]; then echo "keeping $(DESTDIR)/etc/broadcast/broadcast.toml"; \
	else install -D -m 0644 systemd/broadcast.toml $(DESTDIR)/etc/broadcast/broadcast.toml; fi
	install -D -m 0644 README.md $(DESTDIR)$(PREFIX)/share/doc/broadcast/README.md
	@echo "installed; then: systemctl daemon-reload && systemctl enable --now broadcast"
	@echo "control socket users: usermod -aG broadcast NAME (then log in again)"
