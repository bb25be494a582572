@testable import BroadcastCapture
import Atomics
import BroadcastKit
import CPipeWireShim
import ChildProcesses
import Foundation
import Testing

/// A PipeWire connection's loop belongs to one thread for as long as that thread has it, between
/// iterations too (issue 13's SIGSEGV). libpipewire's data thread hands work to the loop with
/// pw_loop_invoke, which runs it at once *on the calling thread* when no thread has the loop
/// entered. With the loop entered only around each iteration, a stream's `process` ran on the data
/// thread while the source's thread went on; when the source's thread let go of the stream at that
/// moment, the data thread's callback held the last reference, destroyed the stream and its context
/// there, unloaded the modules and went back into libpipewire's `process_node`: a jump into
/// unmapped code (core dump of a daemon stopped under load).
///
/// Each test stops the owning thread *between* two iterations and invokes on the loop from another
/// thread, as the data thread does: the call must wait for the owner's next iteration, and run
/// there. These need a PipeWire server: the project's own (scripts/desktop-session.sh, PipeWire
/// only), started per test.
@Suite("PipeWire loops have one owning thread", .serialized)
struct PipeWireLoopOwnershipTests {
    @Test func anAudioConnectionsLoopStaysWithItsThreadBetweenIterations() throws {
        let server = try PipeWireServer()
        defer { server.stop() }
        let owner = LoopOwner { () -> (UnsafeMutablePointer<pw_loop>, () -> Void, () -> Void)? in
            guard let connection = try? PipeWireConnection(remote: server.socket), connection.roundTrip(timeoutNanoseconds: 10_000_000_000) else { return nil }
            // The closures keep the connection: it goes away on this thread, with them.
            return (connection.loop, { connection.iterate(timeoutMilliseconds: 10) }, { _ = connection })
        }
        try owner.check()
        owner.finish()
    }

    @Test func aVideoStreamsLoopStaysWithItsThreadAndMovesToTheNextOne() throws {
        let server = try PipeWireServer()
        defer { server.stop() }
        let opened = VideoHandle()
        // A stream with no target: it never links, but it has its context, data thread and loop.
        let first = LoopOwner { () -> (UnsafeMutablePointer<pw_loop>, () -> Void, () -> Void)? in
            var error = [CChar](repeating: 0, count: 256)
            // Connected as the portal's remote is: a socket of ours, handed over.
            let fd = server.connect()
            guard fd >= 0, let video = CBroadcastPWVideo_open(fd, nil, UInt32.max, 0, "ownership test", &error, error.count) else { return nil }
            opened.video = video
            return (CBroadcastPWVideo_loop(video), { _ = CBroadcastPWVideo_iterate(video, 10) }, { CBroadcastPWVideo_leave(video) })
        }
        try first.check()
        first.finish()
        _ = try #require(opened.video, "the first thread's stream")
        // Handed over, as the portal source does from the thread that opened it to its capture thread.
        let second = LoopOwner { () -> (UnsafeMutablePointer<pw_loop>, () -> Void, () -> Void)? in
            guard let video = opened.video, CBroadcastPWVideo_enter(video) == 0 else { return nil }
            return (CBroadcastPWVideo_loop(video), { _ = CBroadcastPWVideo_iterate(video, 10) }, { CBroadcastPWVideo_close(video) })
        }
        try second.check()
        second.finish()
    }
}

/// The C stream handle, passed between threads in a test.
final class VideoHandle: @unchecked Sendable {
    var video: OpaquePointer?
}

/// A thread that makes a loop (with `make`, on itself), iterates it, and on request stops between
/// two iterations; `check()` then invokes on the loop from the test's thread.
final class LoopOwner: @unchecked Sendable {
    private let pauseRequested = ManagedAtomic<Bool>(false)
    private let paused = ManagedAtomic<Bool>(false)
    private let stopRequested = ManagedAtomic<Bool>(false)
    private let ready = ManagedAtomic<Int>(0)  // 1 made, -1 failed
    private var loop: UnsafeMutablePointer<pw_loop>?
    private var thread: OSThread?

    init(_ make: @escaping @Sendable () -> (UnsafeMutablePointer<pw_loop>, () -> Void, () -> Void)?) {
        thread = OSThread(name: "test-pw-owner") { [self] in
            guard let (loop, iterate, end) = make() else {
                ready.store(-1, ordering: .releasing)
                return
            }
            self.loop = loop
            ready.store(1, ordering: .releasing)
            while !stopRequested.load(ordering: .acquiring) {
                if pauseRequested.load(ordering: .acquiring) {
                    paused.store(true, ordering: .releasing)
                    while pauseRequested.load(ordering: .acquiring) { usleep(1_000) }
                    paused.store(false, ordering: .releasing)
                }
                iterate()
            }
            end()
        }
    }

    /// Waits for a condition the owner thread sets; a deadlock guard, not a timing threshold.
    private func waitFor(_ what: String, _ condition: () -> Bool) throws {
        for _ in 0..<3000 where !condition() { usleep(10_000) }
        guard condition() else { throw OwnershipTestError("\(what) did not happen in 30 s") }
    }

    func check() throws {
        try waitFor("the owner's connection") { ready.load(ordering: .acquiring) != 0 }
        guard ready.load(ordering: .acquiring) == 1, let loop else { throw OwnershipTestError("the owner thread could not connect to PipeWire") }
        pauseRequested.store(true, ordering: .releasing)
        try waitFor("the owner's pause") { paused.load(ordering: .acquiring) }
        let ran = UnsafeMutablePointer<Int32>.allocate(capacity: 1)
        ran.initialize(to: 0)
        defer { ran.deallocate() }
        CBroadcastPW_invokeProbe(loop, ran)
        #expect(CBroadcastPW_probeRan(ran) == 0, "an invoke from another thread ran at once there: the loop had no owner between iterations")
        pauseRequested.store(false, ordering: .releasing)
        try waitFor("the invoke on the owner's thread") { CBroadcastPW_probeRan(ran) == 1 }
    }

    /// Stops the thread (its `end` runs there).
    func finish() {
        stopRequested.store(true, ordering: .releasing)
        thread?.join()
        thread = nil
    }
}

struct OwnershipTestError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// PipeWire (with WirePlumber) from the project's desktop script, without compositor or portal.
/// Clients are pointed at it explicitly (not through PIPEWIRE_REMOTE: the environment is the whole
/// test process's, and other suites start programs that must find their own desktop's PipeWire).
final class PipeWireServer: @unchecked Sendable {
    let directory: URL
    var socket: String { directory.appendingPathComponent("run/pipewire-0").path }

    /// A new connection to the server's socket (-1 on failure), for pw_context_connect_fd.
    func connect() -> Int32 {
        let fd = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return -1 }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let path = Array(socket.utf8CString)
        guard path.count <= MemoryLayout.size(ofValue: address.sun_path) else { close(fd); return -1 }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            path.withUnsafeBytes { raw.copyMemory(from: $0) }
        }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        if connected != 0 { close(fd); return -1 }
        return fd
    }
    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("scripts/desktop-session.sh").path

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("broadcast-pw-\(UUID().uuidString.prefix(8))")
        let start = try ChildProcess.run(
            "/bin/bash", [Self.script, "start", directory.path],
            environment: ProcessInfo.processInfo.environment.merging(["DESKTOP_COMPOSITOR": "0"]) { $1 })
        guard start.status == 0 else {
            stop()
            throw OwnershipTestError("the PipeWire session did not start (scripts/desktop-session.sh; `make deps` installs its packages)")
        }
    }

    func stop() {
        _ = try? ChildProcess.run("/bin/bash", [Self.script, "stop", directory.path])
        try? FileManager.default.removeItem(at: directory)
    }
}
