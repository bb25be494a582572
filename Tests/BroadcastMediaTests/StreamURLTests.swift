import Testing

@testable import BroadcastOutputs

/// What a stream URL shows of itself (issue 24, item 4): everything after the application is the
/// key, also when it has slashes, and a lone path element is masked too.
@Suite struct StreamURLTests {
    @Test(arguments: [
        ("rtmp://h/live/KEY123", "rtmp://h/live/****"),
        ("rtmp://h/live/KEY123/extra", "rtmp://h/live/****"),
        ("rtmp://h/live/KEY123/extra/more", "rtmp://h/live/****"),
        ("rtmp://h/KEY123", "rtmp://h/****"),
        ("rtmp://h/KEY123/", "rtmp://h/****"),
        ("rtmps://h:443/app/KEY123", "rtmps://h:443/app/****"),
        ("rtmp://user:PASSWORD@h/live/KEY123", "rtmp://user:****@h/live/****"),
        ("rtmp://h/live/KEY123?token=SECRET", "rtmp://h/live/****?token=****"),
        ("srt://h:9000?streamid=STREAMID&passphrase=PASSPHRASE&latency=200", "srt://h:9000?streamid=****&passphrase=****&latency=200"),
    ] as [(String, String)])
    func redactedShowsNoSecret(url: String, shown: String) throws {
        let parsed = try StreamURL(url)
        #expect(parsed.redacted == shown)
        for secret in ["KEY123", "extra", "more", "PASSWORD", "SECRET", "STREAMID", "PASSPHRASE"] where url.contains(secret) {
            #expect(!parsed.redacted.contains(secret), "\(secret) in \(parsed.redacted)")
            // FFmpeg's lines name the key alone or the whole path after the application.
            #expect(!parsed.scrub("Sending publish command for '\(secret)'").contains(secret))
        }
        #expect(!parsed.scrub("opening \(url)").contains("KEY123"))
    }

    /// Errors name the URL redacted, and a value without a scheme is never echoed.
    @Test func errorsShowNoKey() {
        for url in ["http://h/live/KEY123", "rtmp://h:99999/live/KEY123", "rtmp:///live/KEY123", "h/live/KEY123"] {
            do {
                _ = try StreamURL(url)
                Issue.record("\(url) was accepted")
            } catch {
                #expect(!error.message.contains("KEY123"), "\(error.message)")
            }
        }
    }

    /// The daemon's registry: what a reload adds is scrubbed too; nothing is forgotten.
    @Test func secretsAccumulate() throws {
        let secrets = StreamSecrets([try StreamURL("rtmp://h/live/first-key")])
        secrets.add([try StreamURL("rtmps://h/live/second-key/part")])
        let line = "publish 'first-key' then 'second-key/part' and 'part'"
        #expect(secrets.scrub(line) == "publish '****' then '****' and '****'")
    }
}
