import Foundation
import Testing

/// Numbers from a user never crash the process (exit 132 before): each is parsed into a bounded
/// range, and one that is out of it is exit 2 with one line saying what is accepted.
@Suite struct NumberTests {
    @Test(arguments: [
        (["--video-bitrate", "1e19"], "--video-bitrate '1e19': must be from 8k to 500M"),
        (["--video-bitrate", "99999999999999999999999"], "--video-bitrate '99999999999999999999999': must be from 8k to 500M"),
        (["--audio-bitrate", "1e30"], "--audio-bitrate '1e30': must be from 8k to 500M"),
        (["--fps", "1e16"], "--fps '1e16': expected frames per second"),
        (["--fps", "3000000001/100000000"], "--fps '3000000001/100000000': numerator and denominator"),
        (["--keyframe-interval", "100000000s"], "--keyframe-interval '100000000s': must be at most 10m"),
        (["--duration", "200000000000000d"], "--duration '200000000000000d': must be at most 3650d"),
        (["--duration=-5s"], "--duration '-5s': must be more than zero"),
        (["--timeout", "1e300"], "--timeout '1e300': must be at most 3650d"),
    ] as [([String], String)])
    func hugeNumbersOnTheCommandLineAreRefused(arguments: [String], message: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let command = arguments.first == "--timeout" ? ["stream", "rtmp://127.0.0.1:9/live/x"] : ["record", "out.mp4"]
        let child = try Child(broadcastBinary, command + arguments, directory: dir.url)
        let r = child.wait(timeout: 30)
        #expect(r.status == 2, "exit \(r.status) for \(arguments); stderr: \(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "one line expected: \(r.stderr)")
        #expect(r.stderr.contains(message), "expected '\(message)' in: \(r.stderr)")
        #expect(dir.contents.isEmpty, "files left behind: \(dir.contents)")
    }

    /// A fraction with huge terms that reduces to a plain rate is that rate.
    @Test func aFractionWithHugeTermsIsReduced() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let child = try Child(
            broadcastBinary, ["record", "out.mkv", "--fps", "3000000000/100000000", "--duration", "1s", "--size", "320x180", "-q"],
            directory: dir.url)
        let r = child.wait(timeout: 60)
        #expect(r.status == 0, "exit \(r.status): \(r.stderr)")
    }

    @Test(arguments: [
        ("retain_for = \"200000000000000d\"", "5: output.retain_for: '200000000000000d': must be at most 3650d"),
        ("retain_for = \"-5d\"", "5: output.retain_for: '-5d': must be more than zero"),
        ("retain_bytes = \"1e300G\"", "5: output.retain_bytes: '1e300G': must be at most 1000000T"),
        ("segment = 1e300", "5: output.segment: '1e+300': must be at most 3650d"),
    ] as [(String, String)])
    func hugeNumbersInTheConfigAreRefused(line: String, expected: String) throws {
        try expectConfigRefused("[[output]]\nname = \"a\"\npath = \"DIR/a.mp4\"\n# the value:\n\(line)\n", expected: expected)
    }

    @Test func hugeBitrateInTheConfigIsRefused() throws {
        try expectConfigRefused(
            "[encoder]\nvideo_bitrate = \"1e300\"\n[[output]]\nname = \"a\"\npath = \"DIR/a.mp4\"\n",
            expected: "2: encoder.video_bitrate: invalid value '1e300': must be from 8k to 500M")
    }

    func expectConfigRefused(_ config: String, expected: String) throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let file = dir.path("bad.toml")
        try config.replacingOccurrences(of: "DIR", with: dir.url.path).write(toFile: file, atomically: true, encoding: .utf8)
        let r = try broadcast(["daemon", "--config", file], timeout: 30)
        #expect(r.status == 2, "exit \(r.status): \(r.stderr)")
        #expect(r.stderr.split(separator: "\n").count == 1, "one line expected: \(r.stderr)")
        #expect(r.stderr.contains("\(file):\(expected)"), "expected '\(file):\(expected)' in: \(r.stderr)")
        #expect(dir.contents == ["bad.toml"], "nothing may be created: \(dir.contents)")
    }
}
