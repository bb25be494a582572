import Foundation
import Testing

/// A headless desktop of the test's own (scripts/desktop-session.sh): a private session bus,
/// PipeWire + WirePlumber + pipewire-pulse, headless sway and the ScreenCast portal, all under a
/// fresh directory, stopped by `stop()`. Each test starts its own (under a second), so tests
/// running in parallel never share a bus, a PipeWire graph or a screen.
///
/// Every package it needs is in the Makefile's APT_PACKAGES; a missing one fails the test with its
/// name rather than skipping it.
final class DesktopSession: @unchecked Sendable {
    struct Options {
        var size = "1280x720"
        /// The background colour ("#rrggbb").
        var background = "#ff0000"
        /// false: PipeWire only (no sway, no portal).
        var compositor = true
        /// false: no xdg-desktop-portal on the bus.
        var portal = true
        /// true: a small terminal at (0,0) redraws 30 times a second, so the cast keeps sending frames.
        var activity = false
        var maxFPS = 30
    }

    let directory: URL
    /// The session's environment (XDG_RUNTIME_DIR, DBUS_SESSION_BUS_ADDRESS, WAYLAND_DISPLAY, ...).
    let environment: [String: String]

    static let script: String = {
        // Tests/BroadcastCLITests/DesktopSession.swift → the package root.
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.appendingPathComponent("scripts/desktop-session.sh").path
    }()

    init(_ options: Options = Options()) throws {
        for tool in ["/usr/bin/pipewire", "/usr/bin/wireplumber", "/usr/bin/pactl", "/usr/bin/sway", "/usr/bin/grim",
                     "/usr/bin/foot", "/usr/libexec/xdg-desktop-portal", "/usr/libexec/xdg-desktop-portal-wlr", "/usr/bin/gcc"]
        where !FileManager.default.isExecutableFile(atPath: tool) {
            throw DesktopSessionError("\(tool) is missing: `make deps` installs the desktop test packages")
        }
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("broadcast-desktop-\(UUID().uuidString.prefix(8))")
        let settings = [
            "DESKTOP_SIZE": options.size, "DESKTOP_BG": options.background,
            "DESKTOP_COMPOSITOR": options.compositor ? "1" : "0", "DESKTOP_PORTAL": options.portal ? "1" : "0",
            "DESKTOP_ACTIVITY": options.activity ? "1" : "0", "DESKTOP_MAX_FPS": String(options.maxFPS),
        ]
        let start = try Child("/bin/bash", [Self.script, "start", directory.path], environment: settings).wait(timeout: 60)
        guard start.status == 0 else {
            _ = try? Child("/bin/bash", [Self.script, "stop", directory.path]).wait(timeout: 30)
            throw DesktopSessionError("the desktop did not start: \(start.stderr)")
        }
        let text = try String(contentsOf: directory.appendingPathComponent("env.sh"), encoding: .utf8)
        var environment: [String: String] = [:]
        for line in text.split(separator: "\n") where line.hasPrefix("export ") {
            let assignment = line.dropFirst("export ".count)
            guard let equals = assignment.firstIndex(of: "=") else { continue }
            var value = assignment[assignment.index(after: equals)...]
            if value.hasPrefix("'"), value.hasSuffix("'"), value.count >= 2 { value = value.dropFirst().dropLast() }
            environment[String(assignment[..<equals])] = String(value)
        }
        self.environment = environment
    }

    /// Runs a tool inside the session (swaymsg, pactl, pw-play, pw-cli, ...).
    @discardableResult
    func run(_ executable: String, _ arguments: [String], timeout: Double = 30) throws -> ProcessResult {
        try Child(executable, arguments, environment: environment).wait(timeout: timeout)
    }

    /// Starts a tool inside the session and leaves it running (a player, a second broadcast).
    func start(_ executable: String, _ arguments: [String]) throws -> Child {
        try Child(executable, arguments, environment: environment)
    }

    /// broadcast itself, inside the session.
    func broadcast(_ arguments: [String], timeout: Double = 120) throws -> ProcessResult {
        try Child(broadcastBinary, arguments, environment: environment).wait(timeout: timeout)
    }

    /// Waits until `count` broadcast streams are linked to the portal's screen cast in the PipeWire
    /// graph, i.e. frames flow to them. A test acts on the screen after this, not after a fixed
    /// sleep: on a busy machine starting broadcast can take seconds. Throws after `timeout`.
    func waitForCastConsumers(_ count: Int = 1, timeout: Double = 30) throws {
        let deadline = Date().addingTimeInterval(timeout)
        var links = ""
        while Date() < deadline {
            links = (try? run("/usr/bin/pw-link", ["-l"]))?.stdout ?? ""
            let linked = links.split(separator: "\n").filter { $0.contains("|-> broadcast") }.count
            if linked >= count { return }
            usleep(50_000)
        }
        throw DesktopSessionError("no \(count) broadcast stream(s) linked to the cast after \(timeout) s: \(links)")
    }

    /// Waits until a port of the PipeWire node `node` (its name, e.g. a sink's) is linked to one of
    /// broadcast's streams: audio from that node reaches the recording from then on. A test plays
    /// its sound after this, not after a fixed sleep (on a busy machine relinking can take seconds).
    /// A guard against hanging, not a measurement: in a loaded full run a desktop test took 175 s
    /// where it takes 11 s alone, and 30 s passed before WirePlumber's switch reached the graph.
    func waitForBroadcastLink(from node: String, timeout: Double = 120) throws {
        try waitForLink(from: node, toPortsContaining: "broadcast", timeout: timeout)
    }

    /// Waits until a port of `node` is linked to a port whose name contains `target`.
    func waitForLink(from node: String, toPortsContaining target: String, timeout: Double = 120) throws {
        let deadline = Date().addingTimeInterval(timeout)
        var links = ""
        while Date() < deadline {
            links = (try? run("/usr/bin/pw-link", ["-l"]))?.stdout ?? ""
            if Self.links(links, from: node, toPortsContaining: target) { return }
            usleep(50_000)
        }
        // What the session's policy says the defaults are (to tell a default that never moved from
        // a move broadcast did not follow).
        let metadata = (try? run("/usr/bin/pw-metadata", ["0"]))?.stdout ?? ""
        throw DesktopSessionError("no link from \(node) to \(target) after \(timeout) s: \(links); metadata: \(metadata)")
    }

    /// Whether `pw-link -l` output has a link from a port of `node` to a port whose name contains
    /// `target` (the output lists each port unindented, then its links as "  |-> PORT" or "  |<- PORT").
    static func links(_ listing: String, from node: String, toPortsContaining target: String) -> Bool {
        var owner = ""
        for line in listing.split(separator: "\n") {
            if !line.hasPrefix(" ") {
                owner = String(line)
            } else if owner.hasPrefix(node + ":"), line.contains("|->"), line.contains(target) {
                return true
            }
        }
        return false
    }

    /// Kills the ScreenCast portal's backend (xdg-desktop-portal-wlr, with its PipeWire node): the
    /// cast is lost, as when a compositor ends it.
    func killPortalBackend() throws {
        let processes = try String(contentsOf: directory.appendingPathComponent("processes"), encoding: .utf8)
        let backends = processes.split(separator: "\n").compactMap { line -> Int32? in
            let fields = line.split(separator: " ")
            return fields.count == 2 && fields[1].hasPrefix("portal-wlr") ? Int32(fields[0]) : nil
        }
        guard !backends.isEmpty else { throw DesktopSessionError("no portal backend in \(processes)") }
        for pid in backends where kill(-pid, SIGKILL) != 0 { kill(pid, SIGKILL) }
    }

    /// Starts the portal's backend again, as the session script does (stopped with the session).
    func startPortalBackend() throws {
        let child = try start("/usr/bin/env", [
            "LD_PRELOAD=" + directory.appendingPathComponent("xdpw-shm-format.so").path,
            "/usr/libexec/xdg-desktop-portal-wlr", "-l", "INFO", "-c", directory.appendingPathComponent("xdpw.conf").path,
        ])
        let line = "\(child.process.processIdentifier) portal-wlr-again\n"
        let handle = try FileHandle(forWritingTo: directory.appendingPathComponent("processes"))
        handle.seekToEndOfFile()
        handle.write(Data(line.utf8))
        try handle.close()
    }

    /// Paints the whole output one colour (sway's background; the portal sends the change as a frame).
    func setBackground(_ colour: String) throws {
        let r = try run("/usr/bin/swaymsg", ["output", "HEADLESS-1", "bg", colour, "solid_color"])
        guard r.status == 0 else { throw DesktopSessionError("swaymsg bg \(colour): \(r.stderr)") }
    }

    /// What a log of the session says (logs/NAME.log: bus, pipewire, wireplumber, sway, portal, portal-wlr).
    func log(_ name: String) -> String {
        (try? String(contentsOf: directory.appendingPathComponent("logs/\(name).log"), encoding: .utf8)) ?? ""
    }

    func stop() {
        _ = try? Child("/bin/bash", [Self.script, "stop", directory.path]).wait(timeout: 30)
        try? FileManager.default.removeItem(at: directory)
    }

    deinit { stop() }
}

struct DesktopSessionError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

@Suite("Desktop test session")
struct DesktopSessionTests {
    /// The harness itself: the portal answers on the private bus, the default sink is the test sink,
    /// and a change of background reaches the screen. Everything else in the desktop tests rests on this.
    @Test func startsAPortalAPipeWireGraphAndAScreen() throws {
        let desktop = try DesktopSession(.init(background: "#0000ff"))
        defer { desktop.stop() }
        let version = try desktop.run("/usr/bin/dbus-send", [
            "--session", "--print-reply", "--dest=org.freedesktop.portal.Desktop", "/org/freedesktop/portal/desktop",
            "org.freedesktop.DBus.Properties.Get", "string:org.freedesktop.portal.ScreenCast", "string:version",
        ])
        #expect(version.status == 0 && version.stdout.contains("uint32"), "ScreenCast version: \(version.stdout) \(version.stderr)")
        let sink = try desktop.run("/usr/bin/pactl", ["get-default-sink"])
        #expect(sink.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "test_sink")
        let source = try desktop.run("/usr/bin/pactl", ["get-default-source"])
        #expect(source.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "test_mic")
        try desktop.setBackground("#00ff00")
        var pixel = ""
        for _ in 0..<100 {
            let grab = try desktop.run("/bin/sh", ["-c", "grim -g '640,360 1x1' -t ppm - | tail -c 3 | od -An -tx1 | tr -d ' \\n'"])
            pixel = grab.stdout
            if pixel == "00ff00" { break }
            usleep(20_000)
        }
        #expect(pixel == "00ff00", "the screen's centre after the change: \(pixel)")
    }

    /// Audio-only sessions have no compositor and no portal, so "no portal answers" can be tested.
    @Test func audioOnlySessionHasNoPortal() throws {
        let desktop = try DesktopSession(.init(compositor: false))
        defer { desktop.stop() }
        #expect(desktop.environment["WAYLAND_DISPLAY"] == nil)
        let names = try desktop.run("/usr/bin/dbus-send", [
            "--session", "--print-reply", "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus.ListNames",
        ])
        #expect(names.status == 0)
        #expect(!names.stdout.contains("org.freedesktop.portal.Desktop"))
        let sinks = try desktop.run("/usr/bin/pactl", ["list", "short", "sinks"])
        #expect(sinks.stdout.contains("test_sink"))
    }
}

/// A desktop session (`options`) with `broadcast record FILE --video portal --audio-mic none --fps 30
/// -q` and `arguments` running in it, seen casting (the portal's stream has its consumer). `body`
/// gets the session, the recording, the file's path (`file` in a temporary directory) and that
/// directory; the session is stopped and the directory removed when it returns.
func withPortalRecording<T>(
    _ options: DesktopSession.Options, file: String, _ arguments: [String] = [],
    _ body: (_ desktop: DesktopSession, _ recording: Child, _ file: String, _ dir: TemporaryDirectory) throws -> T
) throws -> T {
    let desktop = try DesktopSession(options)
    defer { desktop.stop() }
    let dir = try TemporaryDirectory()
    defer { dir.cleanup() }
    let path = dir.path(file)
    let recording = try desktop.start(
        broadcastBinary, ["record", path, "--video", "portal", "--audio-mic", "none", "--fps", "30", "-q"] + arguments)
    try desktop.waitForCastConsumers()
    return try body(desktop, recording, path, dir)
}

/// Stops `recording` as a person does (SIGINT) and expects it to exit 0; `timeout`: a hang guard.
@discardableResult
func stopRecording(_ recording: Child, timeout: Double = 60, sourceLocation: SourceLocation = #_sourceLocation) -> ProcessResult {
    recording.signal(SIGINT)
    let r = recording.wait(timeout: timeout)
    #expect(r.status == 0, "exit \(r.status): \(r.stderr.suffix(2000))", sourceLocation: sourceLocation)
    return r
}
