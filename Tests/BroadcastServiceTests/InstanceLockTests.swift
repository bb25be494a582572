import BroadcastOutputs
import BroadcastService
import ChildProcesses
import Foundation
import Testing

@Suite struct InstanceLockTests {
    /// The first lock holds; a second one on the same directory fails and names the holder's pid;
    /// once the first is released, the directory can be locked again.
    @Test func secondLockFailsAndNamesTheHolder() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("lock-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var first: InstanceLock? = try InstanceLock.forDirectory(dir)
        #expect(first?.path == "\(dir)/.broadcast.lock")
        do {
            _ = try InstanceLock.forDirectory(dir)
            Issue.record("a second lock on \(dir) was granted")
        } catch {
            #expect(error.holder == getpid())
            #expect(error.description.contains("pid \(getpid())"), "\(error)")
        }
        first = nil
        #expect(throws: Never.self) { _ = try InstanceLock.forDirectory(dir) }
    }

    @Test func aDirectoryThatCannotHoldALockIsNamed() {
        #expect(throws: InstanceLock.Failure.self) { _ = try InstanceLock.forDirectory("/nonexistent-\(UUID().uuidString)") }
    }
}

@Suite struct OpenFilesTests {
    /// Another process holding a file open is found (with its pid); our own descriptors are not
    /// counted; a closed file has no holder.
    @Test func findsAnotherProcessHoldingAFile() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("open-\(UUID().uuidString).mp4").path
        FileManager.default.createFile(atPath: path, contents: Data([0]))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let mine = open(path, O_RDONLY)
        defer { close(mine) }
        #expect(OpenFiles.holders(of: [path]).isEmpty, "our own descriptor counted")
        let holder = try ChildProcess("/bin/sh", ["-c", "exec sleep 30 < \"$0\"", path])
        defer { holder.signal(SIGKILL); holder.waitUntilExit() }
        var found: [String: Int32] = [:]
        for _ in 0..<200 {
            found = OpenFiles.holders(of: [path])
            if !found.isEmpty { break }
            usleep(20_000)
        }
        #expect(found[path] == holder.processIdentifier)
        holder.signal(SIGKILL)
        holder.waitUntilExit()
        #expect(OpenFiles.holders(of: [path]).isEmpty)
    }
}
