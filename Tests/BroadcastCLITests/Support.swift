import ChildProcesses
import Foundation
import Testing

/// The `broadcast` binary built next to this test bundle.
let broadcastBinary: String = {
    let bundle = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    var directory = bundle.deletingLastPathComponent()
    // .../debug/broadcastPackageTests.xctest (a file on Linux)
    if !FileManager.default.fileExists(atPath: directory.appendingPathComponent("broadcast").path) {
        directory = directory.deletingLastPathComponent()
    }
    return directory.appendingPathComponent("broadcast").path
}()

struct ProcessResult {
    var status: Int32
    var reason: Process.TerminationReason
    var stdout: String
    var stderr: String
}

/// A running child process whose output is collected in files (no pipe can fill up and stall it).
final class Child: @unchecked Sendable {
    let process: ChildProcess
    private let outURL: URL
    private let errURL: URL

    /// `stdin`: the file (a FIFO, say) the child reads as its standard input.
    init(_ executable: String, _ arguments: [String], directory: URL? = nil, environment: [String: String] = [:], stdin: String = "/dev/null") throws {
        let tmp = FileManager.default.temporaryDirectory.appendingPathComponent("broadcast-child-\(UUID().uuidString)")
        outURL = tmp.appendingPathExtension("out")
        errURL = tmp.appendingPathExtension("err")
        process = try ChildProcess(
            executable, arguments,
            environment: environment.isEmpty ? nil : ProcessInfo.processInfo.environment.merging(environment) { $1 },
            directory: directory?.path, stdout: .file(outURL.path), stderr: .file(errURL.path), stdin: stdin)
    }

    func signal(_ s: Int32) { process.signal(s) }

    var pid: Int32 { process.processIdentifier }

    /// What the child has written to stdout so far (it keeps running).
    var stdoutSoFar: String { (try? String(contentsOf: outURL, encoding: .utf8)) ?? "" }

    /// What the child has written to stderr so far (it keeps running).
    var stderrSoFar: String { (try? String(contentsOf: errURL, encoding: .utf8)) ?? "" }

    /// Polls until `condition` holds on the stderr so far; false if the child exits first or after
    /// `timeout` seconds (a guard against hanging, not a measurement).
    func waitForStderr(timeout: Double = 120, _ condition: (String) -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if condition(stderrSoFar) { return true }
            if !process.isRunning { return condition(stderrSoFar) }
            usleep(50_000)
        }
        return false
    }

    /// Waits for the exit (killing the child after `timeout` seconds, which the result then shows).
    func wait(timeout: Double = 120) -> ProcessResult {
        if !process.wait(timeout: timeout) { process.signal(SIGKILL) }
        process.waitUntilExit()
        let out = (try? String(contentsOf: outURL, encoding: .utf8)) ?? ""
        let err = (try? String(contentsOf: errURL, encoding: .utf8)) ?? ""
        try? FileManager.default.removeItem(at: outURL)
        try? FileManager.default.removeItem(at: errURL)
        return ProcessResult(status: process.terminationStatus, reason: process.terminationReason, stdout: out, stderr: err)
    }
}

/// Writes `config` to `file` in `dir` and starts `broadcast daemon --config` on it, the real binary;
/// `environment` is added to the test's own (a fake $NOTIFY_SOCKET, WATCHDOG_USEC, the ${VAR}s the
/// config names). The end-to-end daemon suites start their daemons through this.
func spawnDaemon(config: String, in dir: TemporaryDirectory, file: String = "d.toml", environment: [String: String] = [:]) throws -> Child {
    try config.write(toFile: dir.path(file), atomically: true, encoding: .utf8)
    return try Child(broadcastBinary, ["daemon", "--config", dir.path(file)], environment: environment)
}

/// The sections most daemon tests need before `[control]`: the test pattern at 320x180 with the
/// tone, keyframes every second.
let testSources = """
    [video]
    size = "320x180"
    [encoder]
    keyframe_interval = "1s"
    """

/// The test pattern at 320x180 with two test tones: the microphone's and the application's.
let twoToneSources = """
    [video]
    size = "320x180"
    [audio]
    mic = "test"
    app = "test"
    """

/// One recording output: `name` to `file` in `dir`, with `keys` (lines of its own) after its path.
func recordingOutput(_ dir: TemporaryDirectory, name: String = "rec", file: String = "rec.mkv", keys: String = "") -> String {
    "[[output]]\nname = \"\(name)\"\npath = \"\(dir.path(file))\"\n" + (keys.isEmpty ? "" : keys + "\n")
}

/// One live output: `name` streaming to `url`, with `keys` (lines of its own) after its url.
func streamOutput(name: String = "live", url: String, keys: String = "") -> String {
    "[[output]]\nname = \"\(name)\"\nurl = \"\(url)\"\n" + (keys.isEmpty ? "" : keys + "\n")
}

/// Recording outputs named `names`, each to `<name>.mkv` in the directory given.
func recordings(_ names: String...) -> (TemporaryDirectory) -> String {
    { dir in names.map { recordingOutput(dir, name: $0, file: "\($0).mkv") }.joined() }
}

/// The daemon config the daemon tests write: `sections`, then `[control]` with `socket` (`c.sock`
/// in `dir` unless given), a TCP listener on 127.0.0.1:`tcpPort` and a `token` when given, and
/// `control`'s further keys; then `outputs` (one recording to `rec.mkv` unless given).
func daemonConfig(
    _ dir: TemporaryDirectory, sections: String = testSources, socket: String? = nil, tcpPort: Int? = nil, token: String? = nil,
    control: String = "", outputs: String? = nil
) -> String {
    let parts = [
        sections, "[control]", "socket = \"\(socket ?? dir.path("c.sock"))\"",
        tcpPort.map { "tcp = \"127.0.0.1:\($0)\"" } ?? "", token.map { "token = \"\($0)\"" } ?? "",
        control, outputs ?? recordingOutput(dir),
    ]
    return parts.filter { !$0.isEmpty }.joined(separator: "\n")
}

/// Writes `daemonConfig` to `dir/d.toml` and starts the daemon on it; its control socket is the
/// second part of the answer.
func launchDaemon(
    _ dir: TemporaryDirectory, sections: String = testSources, tcpPort: Int? = nil, token: String? = nil, control: String = "",
    outputs: String? = nil, environment: [String: String] = [:]
) throws -> (daemon: Child, socket: String) {
    let config = daemonConfig(dir, sections: sections, tcpPort: tcpPort, token: token, control: control, outputs: outputs)
    return (try spawnDaemon(config: config, in: dir, environment: environment), dir.path("c.sock"))
}

/// `launchDaemon` in a fresh directory, seen recording (`waitUntilRecording`'s answer is the third
/// argument), and killed when `body` returns.
func withRecordingDaemon<T>(
    sections: String = testSources, tcpPort: Int? = nil, token: String? = nil, outputs: ((TemporaryDirectory) -> String)? = nil,
    environment: [String: String] = [:],
    _ body: (_ dir: TemporaryDirectory, _ socket: String, _ status: String, _ daemon: Child) throws -> T
) throws -> T {
    let dir = try TemporaryDirectory()
    defer { dir.cleanup() }
    let (daemon, socket) = try launchDaemon(dir, sections: sections, tcpPort: tcpPort, token: token, outputs: outputs?(dir), environment: environment)
    defer { daemon.signal(SIGKILL); _ = daemon.wait(timeout: 10) }
    let status = try waitUntilRecording(socket)
    return try body(dir, socket, status, daemon)
}

/// Asks the daemon's status until the broadcast runs and an output records (at most ~30 s); returns
/// the last answer.
func waitUntilRecording(_ socket: String) throws -> String {
    var last = ""
    for _ in 0..<150 {
        let r = try broadcast(["status", "--socket", socket], timeout: 30)
        last = r.stdout + r.stderr
        if r.status == 0 && r.stdout.contains("\"state\":\"started\"") && r.stdout.contains("\"state\":\"recording\"") {
            return last
        }
        usleep(200_000)
    }
    return last
}

/// ffmpeg listening for SRT on `port` (`query` after `mode=listener`), copying every stream it
/// receives into `file` (MPEG-TS). Fails the test when this ffmpeg has no SRT.
func srtReceiver(port: Int, query: String = "", into file: String) throws -> Child {
    let protocols = try run("/usr/bin/ffmpeg", ["-hide_banner", "-protocols"])
    try #require(protocols.stdout.contains("srt"), "this ffmpeg has no SRT")
    return try Child(
        "/usr/bin/ffmpeg",
        ["-nostdin", "-v", "error", "-f", "mpegts", "-i", "srt://127.0.0.1:\(port)?mode=listener\(query)", "-map", "0", "-c", "copy", "-y", file])
}

func run(_ executable: String, _ arguments: [String], timeout: Double = 120) throws -> ProcessResult {
    try Child(executable, arguments).wait(timeout: timeout)
}

func broadcast(_ arguments: [String], timeout: Double = 120) throws -> ProcessResult {
    try run(broadcastBinary, arguments, timeout: timeout)
}

/// A fresh empty directory, removed by `cleanup()`.
struct TemporaryDirectory {
    let url: URL
    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("broadcast-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }
    func path(_ name: String) -> String { url.appendingPathComponent(name).path }
    var contents: [String] { (try? FileManager.default.contentsOfDirectory(atPath: url.path)) ?? [] }
    func cleanup() { try? FileManager.default.removeItem(at: url) }
}

// MARK: What ffprobe and ffmpeg say about a file

struct Probe {
    struct Stream {
        var codec: String
        var type: String
        var width: Int?
        var height: Int?
        var frames: Int?
        var duration: Double?
    }
    var streams: [Stream]
    var formatDuration: Double?

    var video: Stream? { streams.first { $0.type == "video" } }
    var audio: Stream? { streams.first { $0.type == "audio" } }
}

/// ffprobe with every frame counted (decodes the whole file).
func probe(_ path: String) throws -> Probe {
    let r = try run("/usr/bin/ffprobe", ["-v", "error", "-count_frames", "-show_streams", "-show_format", "-of", "json", path])
    guard r.status == 0, let json = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any] else {
        throw ProbeError(message: "ffprobe \(path) failed: \(r.stderr)")
    }
    let streams = (json["streams"] as? [[String: Any]] ?? []).map { s in
        Probe.Stream(
            codec: s["codec_name"] as? String ?? "",
            type: s["codec_type"] as? String ?? "",
            width: s["width"] as? Int,
            height: s["height"] as? Int,
            frames: (s["nb_read_frames"] as? String).flatMap(Int.init),
            duration: (s["duration"] as? String).flatMap(Double.init)
        )
    }
    let format = json["format"] as? [String: Any]
    return Probe(streams: streams, formatDuration: (format?["duration"] as? String).flatMap(Double.init))
}

struct ProbeError: Error, CustomStringConvertible {
    let message: String
    var description: String { message }
}

/// Everything ffmpeg reports at level error while decoding the whole file (empty: clean).
func decodeErrors(_ path: String) throws -> String {
    // -enc_time_base -1 keeps the file's own time base: by default the null output rounds frame
    // times to 1/fps, and two frames a realtime capture delivered less than a frame interval apart
    // (after a stall) would be reported as equal timestamps that the file does not have.
    let r = try run("/usr/bin/ffmpeg", ["-nostdin", "-v", "error", "-i", path, "-enc_time_base", "-1", "-f", "null", "-"])
    return r.status == 0 ? r.stderr.trimmingCharacters(in: .whitespacesAndNewlines) : "exit \(r.status): \(r.stderr)"
}

/// Decodes the whole file and records what ffmpeg reported at level error, if anything.
func expectDecodesCleanly(_ path: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
    let errors = try decodeErrors(path)
    #expect(errors.isEmpty, "decoding \(path): \(errors)", sourceLocation: sourceLocation)
}

/// Presentation times (s) of decoded video frames whose mean luma is near white.
func whiteFrameTimes(_ path: String) throws -> [Double] {
    let r = try run(
        "/usr/bin/ffmpeg",
        ["-nostdin", "-hide_banner", "-nostats", "-i", path, "-an", "-vf",
         "signalstats,metadata=print:key=lavfi.signalstats.YAVG:file=-", "-f", "null", "-"]
    )
    var times: [Double] = []
    var currentTime: Double?
    for line in r.stdout.split(separator: "\n") {
        if line.hasPrefix("frame:"), let field = line.split(separator: " ").first(where: { $0.hasPrefix("pts_time:") }) {
            currentTime = Double(field.dropFirst("pts_time:".count))
        } else if line.hasPrefix("lavfi.signalstats.YAVG="), let t = currentTime,
            let v = Double(line.dropFirst("lavfi.signalstats.YAVG=".count)), v > 230
        {
            times.append(t)
        }
    }
    return times
}

/// Times (s) where a beep starts: sound after at least 0.1 s of silence that stops again within
/// 0.2 s (which leaves out the end of the file, where silencedetect also closes a silence), plus 0
/// when the file opens with a beep. `audioTrack`: that audio stream (default: ffmpeg's choice).
func beepStartTimes(_ path: String, audioTrack: Int? = nil) throws -> [Double] {
    let select = audioTrack.map { ["-map", "0:a:\($0)"] } ?? ["-vn"]
    let r = try run(
        "/usr/bin/ffmpeg",
        ["-nostdin", "-hide_banner", "-nostats", "-i", path] + select + ["-af", "silencedetect=n=-30dB:d=0.1", "-f", "null", "-"]
    )
    var silenceStarts: [Double] = []
    var silenceEnds: [Double] = []
    for line in r.stderr.split(separator: "\n") {
        for (key, list) in [("silence_start: ", 0), ("silence_end: ", 1)] {
            if let range = line.range(of: key), let v = Double(line[range.upperBound...].split(separator: " ").first ?? "") {
                if list == 0 { silenceStarts.append(v) } else { silenceEnds.append(v) }
            }
        }
    }
    var starts = silenceEnds.filter { end in silenceStarts.contains { $0 > end && $0 - end < 0.2 } }
    // The file opens with a beep when the first silence starts about 50 ms in.
    if let first = silenceStarts.first, first < 0.2 { starts.insert(max(0, first - 0.05), at: 0) }
    return starts
}

/// Presentation times (s) of every packet of one stream ("v:0" or "a:0"), in order.
func packetTimes(_ path: String, stream: String) throws -> [Double] {
    let r = try run("/usr/bin/ffprobe", ["-v", "error", "-select_streams", stream, "-show_entries", "packet=pts_time", "-of", "csv=p=0", path])
    return r.stdout.split(separator: "\n").compactMap { Double($0.trimmingCharacters(in: .whitespaces).trimmingCharacters(in: CharacterSet(charactersIn: ","))) }.sorted()
}

/// Top-level box types of an MP4/MOV file in order (ftyp, moov, mdat, moof, ...).
func mp4TopLevelBoxes(_ path: String) throws -> [String] {
    let data = try Data(contentsOf: URL(fileURLWithPath: path))
    var boxes: [String] = []
    var offset = 0
    while offset + 8 <= data.count {
        var size = Int(data[offset]) << 24 | Int(data[offset + 1]) << 16 | Int(data[offset + 2]) << 8 | Int(data[offset + 3])
        let type = String(decoding: data[(offset + 4)..<(offset + 8)], as: UTF8.self)
        if size == 1, offset + 16 <= data.count {
            size = (8..<16).reduce(0) { $0 << 8 | Int(data[offset + $1]) }
        } else if size == 0 {
            size = data.count - offset
        }
        boxes.append(type)
        guard size >= 8 else { break }
        offset += size
    }
    return boxes
}

/// Video frames the session said it dropped before the handler (no free buffer at the source, a full
/// queue): the sum over the "video: N delivered, ...; dropped: A queue full, B by the source" lines
/// of a log.
func countedVideoDrops(_ log: String) -> Int {
    var total = 0
    for line in log.split(separator: "\n") {
        guard let at = line.range(of: "video: "), let dropped = line[at.upperBound...].range(of: "dropped: ") else { continue }
        let counts = line[dropped.upperBound...].components(separatedBy: ", ")
        for (count, reason) in zip(counts, ["queue full", "by the source"]) where count.hasSuffix(reason) {
            total += Int(count.split(separator: " ").first ?? "") ?? 0
        }
    }
    return total
}
