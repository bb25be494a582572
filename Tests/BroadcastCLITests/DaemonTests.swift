import Foundation
import Testing

/// `broadcast daemon` as a subprocess with temporary configs.
@Suite(.serialized) struct DaemonConfigErrorTests {
    static let valid = """
        [video]
        source = "test"
        size = "320x180"
        fps = 30
        [audio]
        mic = "test"
        [control]
        socket = "SOCKET"
        [[output]]
        name = "rec"
        path = "DIR/rec.mkv"
        """

    /// Each malformed config is refused before anything starts: exit 2, one line naming the file,
    /// the line and the key, and what is expected.
    @Test(arguments: [
        ("[video]\nsize = \"12x\"", "2: video.size: invalid value '12x': expected WIDTHxHEIGHT"),
        ("[video]\nfps = \"fast\"", "2: video.fps: invalid value 'fast': expected frames per second"),
        ("[video]\nfps = 0", "2: video.fps: invalid value '0'"),
        ("[video]\nsource = \"/dev/nothing-here\"", "2: video.source: no video device /dev/nothing-here"),
        ("[video]\nsizee = \"1280x720\"", "2: video.sizee: unknown key: [video] accepts format, fps, input, offset, size, source"),
        ("[video]\nsize = true", "2: video.size: expected a string or a number, got a boolean"),
        ("[audio]\nmic = \"none\"\napp = \"none\"\n[video]\nsource = \"none\"", "5: video.source: nothing to capture: video.source, audio.mic and audio.app are all 'none'"),
        ("[encoder]\nvideo_bitrate = \"lots\"", "2: encoder.video_bitrate: invalid value 'lots': expected bits per second"),
        ("[encoder]\naudio_bitrate = 1", "2: encoder.audio_bitrate: invalid value '1': must be from 8k to 500M"),
        ("[encoder]\npreset = \"warp\"", "2: encoder.preset: unknown encoder.preset 'warp': accepted are ultrafast"),
        ("[encoder]\nkeyframe_interval = \"2x\"", "2: encoder.keyframe_interval: invalid value '2x'"),
        ("[encoder]\nencoder = \"h265_magic\"", "2: encoder.encoder: unknown encoder.encoder 'h265_magic'"),
        ("[encoder]\nrate_control = \"abr\"", "2: encoder.rate_control: invalid value 'abr': accepted are cbr, vbr and crf"),
        ("[encoder]\nframe_rate_mode = \"sometimes\"", "2: encoder.frame_rate_mode: invalid value 'sometimes': accepted are cfr and vfr"),
        ("[encoder]\naudio_tracks = \"many\"", "2: encoder.audio_tracks: invalid value 'many': accepted are mixed, separate and both"),
        ("[audio]\nmic_volume = \"loud\"", "2: audio.mic_volume: invalid value 'loud': expected decibels from -60dB to +20dB"),
        ("[audio]\napp_volume = 21", "2: audio.app_volume: invalid value '21': expected decibels from -60dB to +20dB"),
        ("[audio]\nmic_mute = \"yes\"", "2: audio.mic_mute: invalid value 'yes': expected true or false"),
        ("[audio]\nmic = \"none\"\nmic_denoise = true", "3: audio.mic_denoise: audio.mic_denoise needs a microphone: audio.mic is 'none'"),
        ("[audio]\napp_denoise = true", "2: audio.app_denoise: noise suppression is for the microphone only (audio.mic_denoise)"),
        ("[vidoe]\nsize = \"1280x720\"", "1: unknown table [vidoe]: known are [video]"),
        ("size = \"1280x720\"", "1: size: keys must be inside a table"),
        ("[video]\nsize = \"1280x720", "2: unterminated string"),
        ("[video]\nsize = 1280x720", "2: invalid value '1280x720' for key 'size' (strings need quotes)"),
        ("[video]\nfps = 30\nfps = 25", "3: key 'fps' is set twice (first on line 2)"),
        ("[output]\nname = \"x\"", "1: outputs are an array of tables: write [[output]]"),
        ("[[output]]\npath = \"/tmp/x.mp4\"", "1: output.name: every [[output]] needs a name"),
        ("[[output]]\nname = \"a\"", "1: output: output \"a\" needs either path (a recording) or url (a live stream)"),
        ("[[output]]\nname = \"a\"\npath = \"/tmp/a.mp4\"\nurl = \"rtmp://h/app/key\"", "1: output: output \"a\" has both path and url"),
        ("[[output]]\nname = \"a\"\npath = \"rel.mp4\"", "1: output.path: expected an absolute path"),
        ("[[output]]\nname = \"a b\"\npath = \"/tmp/a.mp4\"", "2: output.name: expected a name of letters"),
        ("[[output]]\nname = \"a\"\npath = \"/tmp/a.mp4\"\nsegment = \"soon\"", "4: output.segment: '"),
        ("[[output]]\nname = \"a\"\npath = \"/tmp/a.mp4\"\ncolor = \"red\"", "4: output.color: unknown key: [[output]] accepts"),
        ("[[output]]\nname = \"a\"\nurl = \"rtmp://h/app/${NO_SUCH_VARIABLE_X}\"", "3: output.url: environment variable NO_SUCH_VARIABLE_X is not set"),
        ("[control]\nsocket = \"relative.sock\"", "2: control.socket: expected an absolute path"),
        ("[control]\ntcp = \"localhost\"", "2: control.tcp: expected HOST:PORT"),
        ("[control]\ntoken = \"short\"", "2: control.token: a token needs at least 16 characters"),
        ("[control]\nsocket_group = \"no-such-group-x\"", "2: control.socket_group: no group named \"no-such-group-x\" on this system"),
        ("[daemon]\nautostart = \"yes\"", "2: daemon.autostart: expected true or false, got a string"),
        ("[[video]]\nsize = \"1280x720\"", "1: [[video]] must be a single table"),
        ("[control]\ntcp = \"127.0.0.1:9999\"", "2: control.tcp: a TCP control listener needs a token"),
        ("", "1: output: no [[output]]: add at least one"),
        ("[control]\nsocket_mode = \"0600\"\n", "2: output: no [[output]]: add at least one"),
        ("[limits]\nmemory = \"12M\"", "2: limits.memory: '12M': expected a size from 16M to 1T"),
        ("[limits]\nmemory = \"lots\"", "2: limits.memory: 'lots': expected a size such as"),
        ("[limits]\nmemroy = \"1G\"", "2: limits.memroy: unknown key: [limits] accepts memory"),
        ("[limits]\nmemory = \"48M\"\n[video]\nsize = \"1920x1080\"\nfps = 60\n[[output]]\nname = \"a\"\npath = \"/tmp/a.mkv\"",
         "2: limits.memory: memory budget 48 MiB is too small for 1920x1080 at 60 fps: it needs at least 8"),
        ("[video]\nsize = \"3840x2160\"\n[[output]]\nname = \"a\"\npath = \"/tmp/a.mkv\"",
         "2: video.size: memory budget 160 MiB is too small for 3840x2160 at 30 fps: it needs at least 2"),
        ("[[output]]\nname = \"a\"\npath = \"/tmp/a.mpeg\"", "3: output.path: recording /tmp/a.mpeg: unsupported extension .mpeg"),
        ("[[output]]\nname = \"a\"\n\npath = \"/tmp/%Y/%m/a\"", "4: output.path: recording /tmp/%Y/%m/a: unsupported extension (none)"),
    ] as [(String, String)])
    func malformedConfigIsRefusedWithFileLineAndKey(config: String, expected: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("bad.toml")
        try config.write(toFile: file, atomically: true, encoding: .utf8)
        let r = try broadcast(["daemon", "--config", file], timeout: 30)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        let lines = r.stderr.split(separator: "\n")
        #expect(lines.count == 1, "one line expected: \(r.stderr)")
        #expect(r.stderr.contains("\(file):\(expected)"), "expected '\(file):\(expected)' in: \(r.stderr)")
        #expect(dir.contents == ["bad.toml"], "nothing may be created: \(dir.contents)")
    }

    @Test func missingConfigFileIsNamed() throws {
        let r = try broadcast(["daemon", "--config", "/nonexistent/broadcast.toml"], timeout: 30)
        #expect(r.status == 2)
        #expect(r.stderr.contains("/nonexistent/broadcast.toml:0: cannot read the config file"))
    }
}

/// A datagram socket standing in for systemd's $NOTIFY_SOCKET: collects what the daemon reports.
final class NotifyListener: @unchecked Sendable {
    let path: String
    private let fd: Int32

    init(directory: TemporaryDirectory) throws {
        path = directory.path("notify.sock")
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: path.utf8)
            raw[path.utf8.count] = 0
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0 else { throw ProbeError(message: "cannot bind \(path)") }
    }

    deinit { close(fd) }

    /// Messages received within `seconds`.
    func receive(for seconds: Double) -> [String] {
        var messages: [String] = []
        let deadline = Date().addingTimeInterval(seconds)
        var buffer = [UInt8](repeating: 0, count: 4096)
        while Date() < deadline {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ms = Int32(max(1, deadline.timeIntervalSinceNow * 1000))
            guard poll(&pfd, 1, ms) > 0 else { continue }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n > 0 { messages.append(String(decoding: buffer[0..<n], as: UTF8.self)) }
        }
        return messages
    }

    /// Waits until a message containing `needle` arrives (at most `seconds`); returns all received.
    func wait(for needle: String, seconds: Double) -> [String] {
        var all: [String] = []
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            all += receive(for: 0.2)
            if all.contains(where: { $0.contains(needle) }) { break }
        }
        return all
    }
}

@Suite(.serialized) struct DaemonLifecycleTests {
    static let frame = 1.0 / 30

    func config(_ dir: TemporaryDirectory, output: String = "rec.mkv", video: String = "test") -> String {
        """
        [video]
        source = "\(video)"
        size = "320x180"
        fps = 30
        [audio]
        mic = "test"
        [control]
        socket = "\(dir.path("control.sock"))"
        [[output]]
        name = "rec"
        path = "\(dir.path(output))"
        """
    }

    func startDaemon(_ dir: TemporaryDirectory, config: String, notify: NotifyListener?, watchdogMicroseconds: Int? = nil) throws -> Child {
        var environment: [String: String] = [:]
        if let notify { environment["NOTIFY_SOCKET"] = notify.path }
        if let watchdogMicroseconds { environment["WATCHDOG_USEC"] = String(watchdogMicroseconds) }
        return try spawnDaemon(config: config, in: dir, file: "daemon.toml", environment: environment)
    }

    func control(_ dir: TemporaryDirectory, _ verb: String) throws -> ProcessResult {
        try broadcast([verb, "--socket", dir.path("control.sock")], timeout: 30)
    }

    /// READY=1 once up, WATCHDOG=1 while frames flow, STOPPING=1 and a finalized file on SIGTERM.
    @Test func notifiesSystemdAndFinishesCleanlyOnSigterm() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let notify = try NotifyListener(directory: dir)
        let daemon = try startDaemon(dir, config: config(dir, output: "rec.mp4"), notify: notify, watchdogMicroseconds: 1_000_000)
        let early = notify.wait(for: "READY=1", seconds: 20)
        #expect(early.contains { $0.contains("READY=1") }, "no READY=1: \(early)")
        let later = notify.receive(for: 3)
        let pings = later.filter { $0 == "WATCHDOG=1" }.count
        #expect(pings >= 4, "expected a ping every 0.5 s while frames flow, got \(pings): \(later)")
        var info = stat()
        #expect(stat(dir.path("control.sock"), &info) == 0 && info.st_mode & 0o777 == 0o660, "control socket mode")
        daemon.signal(SIGTERM)
        let result = daemon.wait(timeout: 30)
        #expect(result.status == 0, "exit \(result.status): \(result.stderr)")
        #expect(notify.receive(for: 0.3).contains { $0.contains("STOPPING=1") } || result.stderr.contains("SIGTERM"))
        let boxes = try mp4TopLevelBoxes(dir.path("rec.mp4"))
        #expect(!boxes.contains("moof") && boxes.contains("moov"), "not finalized: \(boxes)")
        try expectDecodesCleanly(dir.path("rec.mp4"))
        #expect(!FileManager.default.fileExists(atPath: dir.path("control.sock")), "socket removed on exit")
    }

    /// The watchdog is fed only while frames flow: a capture that hangs stops the pings, so systemd
    /// would restart the service.
    @Test func watchdogStopsWhenCaptureStalls() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let notify = try NotifyListener(directory: dir)
        let daemon = try startDaemon(dir, config: config(dir, video: "test:stall-after=4s"), notify: notify, watchdogMicroseconds: 1_000_000)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        let early = notify.wait(for: "READY=1", seconds: 20)
        #expect(early.contains { $0.contains("READY=1") })
        let flowing = notify.receive(for: 2.5).filter { $0 == "WATCHDOG=1" }.count
        #expect(flowing >= 3, "pings while frames flow: \(flowing)")
        // Capture hangs 4 s in. Once the daemon has seen it (on a busy host that is later than 4 s
        // after READY), and the last ping in flight is in, there is none.
        #expect(daemon.waitForStderr(timeout: 60) { $0.contains("no frames since the last check") }, "the stall was not noticed")
        _ = notify.receive(for: 0.6)
        let stalled = notify.receive(for: 3).filter { $0 == "WATCHDOG=1" }.count
        #expect(stalled == 0, "pings after capture stalled: \(stalled)")
    }

    /// status, pause, resume, stop over the control socket; the recording has no gap.
    @Test func controlRoundTrips() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let daemon = try startDaemon(dir, config: config(dir), notify: nil)
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        var status = ProcessResult(status: -1, reason: .exit, stdout: "", stderr: "")
        for _ in 0..<100 {
            status = try control(dir, "status")
            if status.status == 0 && status.stdout.contains("\"state\":\"started\"") { break }
            usleep(200_000)
        }
        #expect(status.stdout.contains("\"state\":\"started\""), "\(status.stdout) \(status.stderr)")
        usleep(2_000_000)
        let paused = try control(dir, "pause")
        #expect(paused.status == 0 && paused.stdout.contains("\"state\":\"paused\""), "\(paused.stdout) \(paused.stderr)")
        let again = try control(dir, "pause")
        #expect(again.status == 1 && again.stderr.contains("already paused"), "second pause: \(again.stderr)")
        usleep(2_000_000)
        let resumed = try control(dir, "resume")
        #expect(resumed.status == 0 && resumed.stdout.contains("\"state\":\"started\""), "\(resumed.stdout) \(resumed.stderr)")
        usleep(2_000_000)
        let metrics = try run("/usr/bin/curl", ["-s", "--unix-socket", dir.path("control.sock"), "http://localhost/metrics"])
        #expect(metrics.stdout.contains("broadcast_running 1"), "\(metrics.stdout)")
        let stopped = try control(dir, "stop")
        #expect(stopped.status == 0 && stopped.stdout.contains("\"state\":\"finished\""), "\(stopped.stdout) \(stopped.stderr)")
        // About 4 s recorded around a 2 s pause: no gap between frames, audio continuous.
        let video = try packetTimes(dir.path("rec.mkv"), stream: "v:0")
        #expect(video.count > 90, "\(video.count) frames")
        // At the resume the next frame is between one and two periods after the last one before the
        // pause (Matroska keeps milliseconds: 66.7 can read 67). A longer gap is a frame missing,
        // which only a drop the daemon counted (a busy host: the source had no free buffer) explains.
        daemon.signal(SIGTERM)
        let exited = daemon.wait(timeout: 30)
        #expect(exited.reason == .exit && exited.status == 0, "after stop and SIGTERM: \(exited.reason) \(exited.status): \(exited.stderr.suffix(1500))")
        let gaps = zip(video, video.dropFirst()).map { $1 - $0 }
        let missing = gaps.filter { $0 > 2 * Self.frame + 0.0015 }.map { Int(($0 / Self.frame).rounded()) - 1 }.reduce(0, +)
        let counted = countedVideoDrops(exited.stderr)
        #expect(missing <= counted, "\(missing) frames missing in gaps up to \(gaps.max() ?? 0) s; \(counted) dropped by the daemon's count")
        try expectDecodesCleanly(dir.path("rec.mkv"))
    }

    /// SIGKILL leaves a fragmented MP4; the next start finalizes it.
    @Test func orphanedRecordingIsRepairedAtStartup() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let first = try startDaemon(dir, config: config(dir, output: "crash-%H%M%S.mp4"), notify: nil)
        usleep(5_000_000)
        first.signal(SIGKILL)
        _ = first.wait(timeout: 10)
        let orphan = try #require(dir.contents.first { $0.hasPrefix("crash-") })
        #expect(try mp4TopLevelBoxes(dir.path(orphan)).contains("moof"), "expected a fragmented file after SIGKILL")
        // What the crash left: the repair must keep every frame of it (how many depends on how fast
        // the machine started the daemon, so it is counted, not assumed).
        let leftFrames = try probe(dir.path(orphan)).video?.frames ?? 0
        #expect(leftFrames >= 30, "the fragmented file holds \(leftFrames) frames")
        usleep(1_100_000)  // the next recording gets another name
        let second = try startDaemon(dir, config: config(dir, output: "crash-%H%M%S.mp4"), notify: nil)
        for _ in 0..<100 where (try? mp4TopLevelBoxes(dir.path(orphan)).contains("moof")) ?? true { usleep(100_000) }
        second.signal(SIGTERM)
        let result = second.wait(timeout: 30)
        #expect(result.status == 0)
        #expect(result.stderr.contains("recovering \(dir.path(orphan))"), "\(result.stderr)")
        let boxes = try mp4TopLevelBoxes(dir.path(orphan))
        #expect(!boxes.contains("moof") && boxes.contains("moov"), "not repaired: \(boxes)")
        try expectDecodesCleanly(dir.path(orphan))
        // Every frame of the complete fragments; a last fragment the kill cut part-way (rare: each
        // is written in one go) may go, so up to one fragment (2 s, 60 frames) less.
        let repaired = try probe(dir.path(orphan)).video?.frames ?? 0
        #expect(repaired <= leftFrames && repaired >= leftFrames - 60 && repaired > 0, "\(repaired) of \(leftFrames) frames kept")
    }
}

@Suite struct SystemdUnitTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The unit passes `systemd-analyze verify` (with ExecStart pointed at the built binary).
    @Test func unitVerifies() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let unit = try String(contentsOf: Self.repository.appendingPathComponent("systemd/broadcast.service"), encoding: .utf8)
        for needle in ["Type=notify", "WatchdogSec=", "Restart=on-failure", "ProtectSystem=strict", "ProtectHome=yes",
                       "PrivateTmp=yes", "NoNewPrivileges=yes", "RestrictAddressFamilies=", "DeviceAllow=char-video4linux",
                       "DeviceAllow=char-alsa", "SupplementaryGroups=video audio broadcast", "StateDirectory=", "RuntimeDirectory="] {
            #expect(unit.contains(needle), "the unit should have \(needle)")
        }
        let local = dir.path("broadcast.service")
        try unit.replacingOccurrences(of: "/usr/local/bin/broadcast", with: broadcastBinary).write(toFile: local, atomically: true, encoding: .utf8)
        let r = try run("/usr/bin/systemd-analyze", ["verify", local])
        #expect(r.status == 0, "systemd-analyze verify: \(r.stdout) \(r.stderr)")
        #expect(r.stderr.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty, "warnings: \(r.stderr)")
    }

    /// The socket's access as the unit and the example config set it up, with real users: the
    /// daemon runs as a user of its own with the config's `socket_group` as a supplementary group
    /// (the unit's `SupplementaryGroups=` must list it), in a runtime directory made the way systemd
    /// makes it (the unit's `RuntimeDirectoryMode=`, owned by the daemon's user). A user in that
    /// group gets its status; a user outside it is refused. (With the earlier unit's 0750 the member
    /// could not pass the directory: the daemon's user is dynamic, so its group has no members.)
    @Test func aMemberOfTheSocketGroupReachesTheDaemonAndOthersDoNot() throws {
        try #require(getuid() == 0, "this test makes users and groups: run the tests as root (CI does)")
        let unit = try String(contentsOf: Self.repository.appendingPathComponent("systemd/broadcast.service"), encoding: .utf8)
        let example = try String(contentsOf: Self.repository.appendingPathComponent("systemd/broadcast.toml"), encoding: .utf8)
        func setting(_ text: String, _ key: String, separator: String) -> String? {
            text.split(separator: "\n").lazy.map { $0.trimmingCharacters(in: .whitespaces) }
                .first { $0.hasPrefix(key + separator) }
                .map { String($0.dropFirst(key.count + separator.count)).split(separator: "#").first.map(String.init) ?? "" }
                .map { $0.trimmingCharacters(in: .whitespaces).trimmingCharacters(in: CharacterSet(charactersIn: "\"")) }
        }
        let directoryMode = try #require(setting(unit, "RuntimeDirectoryMode", separator: "=").flatMap { mode_t($0, radix: 8) })
        let supplementary = setting(unit, "SupplementaryGroups", separator: "=")?.split(separator: " ").map(String.init) ?? []
        let group = try #require(setting(example, "socket_group", separator: " = "), "the example config names no socket_group")
        #expect(supplementary.contains(group), "the unit's SupplementaryGroups= (\(supplementary)) lacks the socket's group \(group)")
        let socketMode = setting(example, "socket_mode", separator: " = ") ?? "0660"

        // Stand-ins with names of their own, removed after: the group, the daemon's user, a member, a stranger.
        let tag = String(UInt32.random(in: 0..<UInt32.max), radix: 36)
        let (standIn, service, member, stranger) = ("bcg\(tag)", "bcd\(tag)", "bcm\(tag)", "bcs\(tag)")
        #expect(try run("/usr/sbin/groupadd", ["--system", standIn]).status == 0)
        defer { _ = try? run("/usr/sbin/groupdel", [standIn]) }
        for (user, groups) in [(service, []), (member, [standIn]), (stranger, [])] {
            let added = try run("/usr/sbin/useradd", ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin"] + (groups.isEmpty ? [] : ["-G", groups.joined(separator: ",")]) + [user])
            #expect(added.status == 0, "useradd \(user): \(added.stderr)")
        }
        defer { for user in [service, member, stranger] { _ = try? run("/usr/sbin/userdel", [user]) } }
        let serviceID = try #require(getpwnam(service)).pointee.pw_uid

        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        chmod(dir.url.path, 0o755)
        let runtime = dir.path("run")
        try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: false)
        chown(runtime, serviceID, gid_t.max)
        chmod(runtime, directoryMode)
        let recordings = dir.path("lib")
        try FileManager.default.createDirectory(atPath: recordings, withIntermediateDirectories: false)
        chown(recordings, serviceID, gid_t.max)
        let socket = runtime + "/control.sock"
        let config = dir.path("d.toml")
        try """
            [video]
            size = "320x180"
            [control]
            socket = "\(socket)"
            socket_group = "\(standIn)"
            socket_mode = "\(socketMode)"
            [[output]]
            name = "rec"
            path = "\(recordings)/rec.mkv"
            """.write(toFile: config, atomically: true, encoding: .utf8)
        chmod(config, 0o644)
        let daemon = try Child("/usr/bin/setpriv", ["--reuid", service, "--regid", service, "--groups", standIn, "--", broadcastBinary, "daemon", "--config", config])
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        #expect(daemon.waitForStderr(timeout: 60) { $0.contains(socket) }, "\(daemon.stderrSoFar)")
        var info = stat()
        #expect(stat(socket, &info) == 0 && info.st_gid == (getgrnam(standIn)?.pointee.gr_gid ?? 0), "the socket's group")
        #expect(String(info.st_mode & 0o777, radix: 8) == String(socketMode.dropFirst(socketMode.hasPrefix("0") ? 1 : 0)), "the socket's mode")

        func status(as user: String) throws -> ProcessResult {
            try run("/usr/bin/setpriv", ["--reuid", user, "--regid", user, "--init-groups", "--", broadcastBinary, "status", "--json", "--socket", socket])
        }
        let allowed = try status(as: member)
        #expect(allowed.status == 0 && allowed.stdout.contains("\"state\""), "the member: exit \(allowed.status): \(allowed.stderr)")
        let refused = try status(as: stranger)
        #expect(refused.status != 0 && refused.stderr.contains("Permission denied"), "the stranger: exit \(refused.status): \(refused.stdout) \(refused.stderr)")
        daemon.signal(SIGTERM)
        #expect(daemon.wait(timeout: 60).status == 0)
    }

    /// The example configs are valid: the daemon gets past loading them (then fails only to bind
    /// /run/broadcast when that is not writable, or starts; either way not exit 2).
    @Test(arguments: ["systemd/broadcast.toml", "samples/daemon.toml"])
    func exampleConfigLoads(path: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        var text = try String(contentsOf: Self.repository.appendingPathComponent(path), encoding: .utf8)
        // Keep the test's files in its own directory.
        text = text.replacingOccurrences(of: "/run/broadcast/control.sock", with: dir.path("c.sock"))
            .replacingOccurrences(of: "/tmp/broadcast-sample.sock", with: dir.path("c.sock"))
            .replacingOccurrences(of: "/var/lib/broadcast/", with: dir.path(""))
            .replacingOccurrences(of: "/tmp/broadcast-sample-", with: dir.path("sample-"))
            // The service's group exists where `make install` ran; here the test's own group stands in.
            .replacingOccurrences(of: "socket_group = \"broadcast\"", with: "socket_group = \"root\"")
        let file = dir.path("config.toml")
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        let daemon = try Child(broadcastBinary, ["daemon", "--config", file])
        var up = false
        for _ in 0..<100 {
            if FileManager.default.fileExists(atPath: dir.path("c.sock")) { up = true; break }
            usleep(100_000)
        }
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 30)
        #expect(up, "the daemon never opened its control socket: \(r.stderr)")
        #expect(r.status == 0, "exit \(r.status): \(r.stderr)")
    }
}

@Suite(.serialized) struct DaemonOutputTests {
    static let frame = 1.0 / 30


    /// Pause one output while the other goes on: the paused recording skips the pause without a gap,
    /// the other keeps everything.
    @Test func pausingOneOutputLeavesTheOtherRunning() throws {
        try withRecordingDaemon(outputs: recordings("rec", "archive")) { dir, socket, up, daemon in
            #expect(up.contains("\"name\":\"rec\""), "\(up)")
            usleep(2_500_000)
            // The pause lasts from the pause command to the resume command as the clock saw it: under
            // load starting the `broadcast` client alone takes seconds, so the fixed sleep is only its floor.
            let clock = ContinuousClock()
            let pauseSent = clock.now
            let paused = try broadcast(["pause", "--output", "rec", "--socket", socket])
            let pauseAnswered = clock.now
            #expect(paused.status == 0, "\(paused.stderr)")
            #expect(paused.stdout.contains("\"name\":\"rec\",\"kind\":\"recording\""), "\(paused.stdout)")
            let wrong = try broadcast(["pause", "--output", "nope", "--socket", socket])
            #expect(wrong.status == 1 && wrong.stderr.contains("no output named nope"), "\(wrong.stderr)")
            // A name no config allows (a space, a '%') is still sent as that name and answered as one.
            let odd = try broadcast(["pause", "--output", "no such 50%", "--socket", socket])
            #expect(odd.status == 1 && odd.stderr.contains("no output named no such 50%"), "\(odd.stderr)")
            usleep(3_000_000)
            let resumeSent = clock.now
            let resumed = try broadcast(["resume", "--output", "rec", "--socket", socket])
            let resumeAnswered = clock.now
            #expect(resumed.status == 0, "\(resumed.stderr)")
            usleep(2_500_000)
            let stopped = try broadcast(["stop", "--socket", socket])
            #expect(stopped.status == 0, "\(stopped.stderr)")

            let rec = try packetTimes(dir.path("rec.mkv"), stream: "v:0")
            let archive = try packetTimes(dir.path("archive.mkv"), stream: "v:0")
            let recGaps = zip(rec, rec.dropFirst()).map { $1 - $0 }
            // Under two periods (Matroska keeps milliseconds: 66.7 can read 67).
            #expect((recGaps.max() ?? 1) < 2 * Self.frame + 0.0015, "the paused recording has a gap of \(recGaps.max() ?? 0) s")
            let archiveGaps = zip(archive, archive.dropFirst()).map { $1 - $0 }
            #expect((archiveGaps.max() ?? 1) < 2 * Self.frame + 0.0015)
            // The paused one lacks the pause (up to a keyframe interval, 2 s, more: it resumes on a
            // keyframe), the other has it all.
            let seconds = { (d: Duration) in Double(d.components.seconds) + Double(d.components.attoseconds) * 1e-18 }
            let shortest = seconds(resumeSent - pauseAnswered), longest = seconds(resumeAnswered - pauseSent)
            let missing = Double(archive.count - rec.count) * Self.frame
            #expect(missing > shortest - 0.2 && missing < longest + 2.5,
                    "rec has \(rec.count) frames, archive \(archive.count): \(missing) s missing, paused for \(shortest)–\(longest) s")
            #expect(abs((rec.last ?? 0) - (rec.first ?? 0) - Double(rec.count - 1) * Self.frame) < 0.1, "rec's timeline is continuous")
            try expectDecodesCleanly(dir.path("rec.mkv"))
        }
    }

    /// Segments of 2 s: several files, each playable and starting at zero, no frame lost or doubled
    /// at the cuts.
    @Test func segmentsSplitWithoutLosingFrames() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "rec"
            path = "\(dir.path("seg-%H%M%S.mp4"))"
            segment = "2s"
            """)
        _ = try waitUntilRecording(socket)
        usleep(7_000_000)
        let status = try broadcast(["status", "--socket", socket])
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 30)
        #expect(r.status == 0, "\(r.stderr)")
        let files = dir.contents.filter { $0.hasPrefix("seg-") && $0.hasSuffix(".mp4") }.sorted()
        #expect(files.count >= 3, "segments: \(files)")
        var total = 0
        for file in files {
            let p = try probe(dir.path(file))
            let frames = p.video?.frames ?? 0
            total += frames
            try expectDecodesCleanly(dir.path(file))
            #expect(try mp4TopLevelBoxes(dir.path(file)).contains("moov"))
            let first = try packetTimes(dir.path(file), stream: "v:0").first ?? 99
            #expect(first < 0.1, "\(file) starts at \(first) s, not at zero")
        }
        // Every encoded frame is in exactly one segment.
        let encoded = Int(r.stderr.firstMatch(of: /(\d+) video frames, \d+ audio frames encoded/)?.1 ?? "-1") ?? -1
        #expect(total == encoded, "\(total) frames in the segments, \(encoded) encoded")
        #expect(status.stdout.contains("\"name\":\"rec\""))
    }
}

@Suite(.serialized) struct DaemonReloadTests {
    /// SIGHUP re-reads the outputs: one added and later removed while the recording goes on
    /// uninterrupted in one file.
    @Test func sighupChangesOutputsWithoutInterruptingTheRecording() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("c.sock")
        func write(extra: Bool) throws {
            var config = """
                [video]
                size = "320x180"
                [control]
                socket = "\(socket)"
                [[output]]
                name = "rec"
                path = "\(dir.path("rec-%H%M%S.mkv"))"
                """
            if extra { config += "\n[[output]]\nname = \"extra\"\npath = \"\(dir.path("extra.mkv"))\"\n" }
            try config.write(toFile: dir.path("d.toml"), atomically: true, encoding: .utf8)
        }
        try write(extra: false)
        let daemon = try Child(broadcastBinary, ["daemon", "--config", dir.path("d.toml")])
        _ = try waitUntilRecording(socket)
        usleep(2_000_000)
        try write(extra: true)
        daemon.signal(SIGHUP)
        usleep(3_000_000)
        let during = try broadcast(["status", "--socket", socket]).stdout
        #expect(during.contains("\"name\":\"extra\""), "\(during)")
        try write(extra: false)
        daemon.signal(SIGHUP)
        usleep(2_000_000)
        let after = try broadcast(["status", "--socket", socket]).stdout
        #expect(!after.contains("\"name\":\"extra\""), "\(after)")
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 30)
        #expect(r.status == 0, "\(r.stderr)")
        let recordings = dir.contents.filter { $0.hasPrefix("rec-") }
        #expect(recordings.count == 1, "the recording was not interrupted: \(recordings)")
        var recorded = 0
        if let rec = recordings.first {
            let times = try packetTimes(dir.path(rec), stream: "v:0")
            let gaps = zip(times, times.dropFirst()).map { $1 - $0 }
            #expect((gaps.max() ?? 1) < 2.0 / 30, "gap \(gaps.max() ?? 0)")
            #expect(times.count > 5 * 30, "\(times.count) frames")
            recorded = times.count
        }
        // The added output started after the recording's first 2 s and ended before it did (judged
        // against what this run recorded, not the wall clock: on a busy host a reload takes longer).
        let extra = try probe(dir.path("extra.mkv"))
        let frames = extra.video?.frames ?? 0
        #expect(frames > 30 && frames < recorded - 45, "the added output has \(frames) frames, the recording \(recorded)")
        try expectDecodesCleanly(dir.path("extra.mkv"))
    }
}

@Suite(.serialized) struct DaemonControlAccessTests {
    /// Missing directories for the socket and the recordings are made (outside systemd nothing
    /// makes /run/broadcast or /var/lib/broadcast); TCP control answers only with the token.
    @Test func makesItsDirectoriesAndGuardsTCPWithAToken() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let socket = dir.path("run/broadcast/c.sock")
        let port = 20_000 + Int(getpid() % 20_000)
        let token = "0123456789abcdef-token"
        let config = """
            [video]
            size = "320x180"
            [control]
            socket = "\(socket)"
            tcp = "127.0.0.1:\(port)"
            token = "${TEST_TOKEN}"
            [[output]]
            name = "rec"
            path = "\(dir.path("lib/broadcast/rec.mkv"))"
            """
        let daemon = try spawnDaemon(config: config, in: dir, environment: ["TEST_TOKEN": token])
        defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
        for _ in 0..<150 where !FileManager.default.fileExists(atPath: socket) { usleep(100_000) }
        #expect(FileManager.default.fileExists(atPath: socket), "no socket at \(socket)")
        let url = "http://127.0.0.1:\(port)/v1/status"
        let without = try run("/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", url])
        #expect(without.stdout == "401", "without a token: \(without.stdout)")
        let wrong = try run("/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Authorization: Bearer nope", url])
        #expect(wrong.stdout == "401", "with a wrong token: \(wrong.stdout)")
        let with = try run("/usr/bin/curl", ["-s", "-H", "Authorization: Bearer \(token)", url])
        #expect(with.stdout.contains("\"uptime_seconds\""), "with the token: \(with.stdout)")
        #expect(!with.stdout.contains(token), "the token in the status")
        let metrics = try run("/usr/bin/curl", ["-s", "-H", "Authorization: Bearer \(token)", "http://127.0.0.1:\(port)/metrics"])
        #expect(metrics.stdout.contains("broadcast_running") && !metrics.stdout.contains(token))
        daemon.signal(SIGTERM)
        let ended = daemon.wait(timeout: 30)
        #expect(ended.status == 0)
        #expect(!ended.stderr.contains(token), "the token in the log")
        #expect(FileManager.default.fileExists(atPath: dir.path("lib/broadcast/rec.mkv")))
    }
}

@Suite(.serialized) struct DaemonRetentionTests {
    /// retain_bytes deletes the oldest finished segments while the total is over the limit; the
    /// file being written is never deleted.
    @Test func retentionBySizeKeepsOnlyWhatFits() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let (daemon, socket) = try launchDaemon(dir, outputs: """
            [[output]]
            name = "rec"
            path = "\(dir.path("ret-%H%M%S.mkv"))"
            segment = "1s"
            retain_bytes = "1k"
            """)
        _ = try waitUntilRecording(socket)
        usleep(5_000_000)
        daemon.signal(SIGTERM)
        let r = daemon.wait(timeout: 30)
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.stderr.components(separatedBy: "retention: deleted").count - 1 >= 2, "\(r.stderr)")
        let left = dir.contents.filter { $0.hasPrefix("ret-") }
        #expect(left.count == 1, "only the last segment fits in 1 KiB of retention: \(left)")
    }
}
