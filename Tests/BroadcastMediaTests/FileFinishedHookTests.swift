import Testing

@testable import BroadcastOutputs

#if canImport(Glibc)
    import Glibc
#endif

/// What a finished-file command inherits of the daemon's environment (issue 24, item 4): the
/// allow-list and LC_*, nothing else.
@Suite struct FileFinishedHookTests {
    @Test func environmentIsTheAllowList() {
        let given = [
            "STREAM_KEY=sk-secret", "AWS_SECRET_ACCESS_KEY=abc", "CREDENTIALS_DIRECTORY=/run/credentials/broadcast.service",
            "PATH=/usr/bin", "HOME=/var/lib/broadcast", "LANG=C.UTF-8", "LC_TIME=de_DE.UTF-8", "NOTIFY_SOCKET=/run/systemd/notify",
            "XDG_RUNTIME_DIR=/run/user/1000", "BROADCAST_FILE=/old", "noequals",
        ]
        let pointers = given.map { strdup($0) } + [nil]
        defer { for p in pointers { free(p) } }
        let kept = pointers.withUnsafeBufferPointer { buffer in
            FileFinishedHook.environment(inheriting: UnsafeMutablePointer(mutating: buffer.baseAddress!))
        }
        #expect(kept == ["PATH=/usr/bin", "HOME=/var/lib/broadcast", "LANG=C.UTF-8", "LC_TIME=de_DE.UTF-8", "XDG_RUNTIME_DIR=/run/user/1000"])
        let none = [UnsafeMutablePointer<CChar>?](repeating: nil, count: 1)
        let defaults = none.withUnsafeBufferPointer { FileFinishedHook.environment(inheriting: UnsafeMutablePointer(mutating: $0.baseAddress!)) }
        #expect(defaults == ["PATH=/usr/local/bin:/usr/bin:/bin"])
    }
}
