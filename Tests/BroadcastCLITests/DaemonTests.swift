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
        ("[video]\nsource = \"/dev/nothing-here\"", "2: video.source"),
        ("[video]\nsizee = \"1280x720\"", "2: video.sizee: unknown key: [video] accepts fps, size, source"),
        ("[video]\nsize = true", "2: video.size: expected a string or a number, got a boolean"),
        ("[audio]\nmic = \"none\"\napp = \"none\"\n[video]\nsource = \"none\"", "5: video.source: nothing to capture: video.source, audio.mic and audio.app are all 'none'"),
        ("[encoder]\nvideo_bitrate = \"lots\"", "2: encoder.video_bitrate: invalid value 'lots': expected bits per second"),
        ("[encoder]\naudio_bitrate = 1", "2: encoder.audio_bitrate: invalid value '1': must be from 8k to 500M"),
        ("[encoder]\npreset = \"warp\"", "2: encoder.preset: unknown encoder.preset 'warp': accepted are ultrafast"),
        ("[encoder]\nkeyframe_interval = \"2x\"", "2: encoder.keyframe_interval: invalid value '2x'"),
        ("[encoder]\nencoder = \"h265_magic\"", "2: encoder.encoder: unknown encoder.encoder 'h265_magic'"),
        ("[encoder]\nrate_control = \"abr\"", "2: encoder.rate_control: invalid value 'abr': accepted are cbr, vbr and crf"),
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
        ("[daemon]\nautostart = \"yes\"", "2: daemon.autostart: expected true or false, got a string"),
        ("[[video]]\nsize = \"1280x720\"", "1: [[video]] must be a single table"),
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
