import ChildProcesses
import Foundation
import Testing

@testable import BroadcastCapture

/// An Xvfb server on a free display number, with X clients drawing known content; everything
/// started here is stopped by its PID in `stop()`.
///
/// Xvfb and the clients (xlogo, ico from x11-apps) are Debian packages that `make test` installs
/// (APT_PACKAGES); a missing one fails the test with the package to install rather than skipping it.
final class VirtualDisplay: @unchecked Sendable {
    let number: Int
    let width: Int
    let height: Int
    var name: String { ":\(number)" }
    private let server: ChildProcess
    private var clients: [ChildProcess] = []

    /// - Parameter extensions: e.g. ["-extension", "MIT-SHM"] to start without MIT-SHM.
    init(width: Int = 320, height: Int = 240, arguments extra: [String] = []) throws {
        for tool in ["/usr/bin/Xvfb", "/usr/bin/xlogo", "/usr/bin/ico"] where !FileManager.default.isExecutableFile(atPath: tool) {
            throw VirtualDisplayError("\(tool) is missing: install xvfb and x11-apps (make deps does)")
        }
        self.width = width
        self.height = height
        // A number no server uses: neither its lock file nor its socket exists. Tests run in
        // parallel, so the process id spreads them apart.
        var candidate = 100 + Int(getpid() % 200) * 4 + Int.random(in: 0..<4)
        while FileManager.default.fileExists(atPath: "/tmp/.X\(candidate)-lock")
            || FileManager.default.fileExists(atPath: "/tmp/.X11-unix/X\(candidate)")
        {
            candidate += 1
        }
        number = candidate
        server = try ChildProcess(
            "/usr/bin/Xvfb", [":\(number)", "-screen", "0", "\(width)x\(height)x24", "-nolisten", "tcp", "-noreset"] + extra)
        let deadline = Date().addingTimeInterval(10)
        while !FileManager.default.fileExists(atPath: "/tmp/.X11-unix/X\(number)") {
            guard server.isRunning, Date() < deadline else {
                stop()
                throw VirtualDisplayError("Xvfb :\(number) did not start")
            }
            usleep(20_000)
        }
        usleep(100_000)
    }

    /// Starts an X client on this display; it is stopped with the display.
    @discardableResult
    func client(_ tool: String, _ arguments: [String]) throws -> ChildProcess {
        let process = try ChildProcess(tool, arguments, environment: ["DISPLAY": name, "PATH": "/usr/bin:/bin"])
        clients.append(process)
        return process
    }

    /// A window filled with one colour (xlogo with foreground = background), titled `title`.
    @discardableResult
    func solidWindow(_ colour: String, x: Int, y: Int, width: Int, height: Int, title: String) throws -> ChildProcess {
        let process = try client(
            "/usr/bin/xlogo",
            ["-bw", "0", "-bg", colour, "-fg", colour, "-geometry", "\(width)x\(height)+\(x)+\(y)", "-title", title, "-name", title])
        // Wait until the server has it mapped under its title (a fixed 0.5 s was too short on a
        // busy host: "no window titled"); its background is the colour, painted by the server at
        // the map, so mapped is painted.
        let deadline = Date().addingTimeInterval(30)
        while true {
            if let connection = try? X11Connection(display: name), let window = connection.findWindow(titled: title),
                connection.title(of: window) == title
            {
                break
            }
            guard process.isRunning, Date() < deadline else {
                throw VirtualDisplayError("xlogo did not map a window titled \"\(title)\" on \(name) within 30 s")
            }
            usleep(20_000)
        }
        usleep(50_000)
        return process
    }

    /// Kills one client now (SIGKILL) and waits for it.
    func kill(_ process: ChildProcess) {
        process.signal(SIGKILL)
        process.waitUntilExit()
    }

    func stop() {
        // Everything is killed before anything is waited for. SIGKILL: nothing here needs a clean
        // exit, so the server's lock file and socket are ours to remove.
        let running = (clients + [server]).filter(\.isRunning)
        for process in running { process.signal(SIGKILL) }
        for process in running { process.waitUntilExit() }
        clients = []
        if !running.isEmpty {
            try? FileManager.default.removeItem(atPath: "/tmp/.X\(number)-lock")
            try? FileManager.default.removeItem(atPath: "/tmp/.X11-unix/X\(number)")
        }
    }

    deinit { stop() }
}

struct VirtualDisplayError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
