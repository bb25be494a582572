import ArgumentParser
import BroadcastDaemon
import BroadcastKit
import BroadcastService
import Logging
import ServiceLifecycle

#if canImport(Glibc)
import Glibc
#endif

/// `broadcast ui`: the control page on 127.0.0.1 for someone who has only the daemon's socket.
struct UI: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ui",
        abstract: "Serve the control page on 127.0.0.1, forwarding to the daemon's socket.",
        discussion: """
            Prints the page's URL with a fresh token in its fragment (#token=...: browsers never \
            send a fragment to the server), valid while this command runs. --open gives xdg-open \
            another URL, with a one-time login code instead (#login=...: a program's arguments can \
            be read by every local user), which the page exchanges for the token once, within 60 \
            seconds. The page shows the broadcast's state, outputs, sources, audio meters and a \
            preview, and has its controls. Runs until SIGINT or SIGTERM.
            """
    )

    @OptionGroup var control: ControlOptions

    @Option(help: ArgumentHelp("The TCP port on 127.0.0.1 (default: a free one).", valueName: "port"))
    var port: Int = 0

    @Flag(help: "Open the page in the desktop's browser (with xdg-open, where it exists), logged in with a one-time code.")
    var open = false

    func validate() throws {
        guard (0...65535).contains(port) else { throw ValidationError("invalid --port '\(port)': expected 0 to 65535") }
    }

    func run() async throws {
        let logger = Logging.bootstrap(level: .notice)
        let server: PageServer
        do {
            server = try PageServer(daemonSocket: control.socket, port: UInt16(port), logger: logger)
        } catch {
            throw ValueError(error.message)
        }
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: [.init(service: server, successTerminationBehavior: .gracefullyShutdownGroup)],
                gracefulShutdownSignals: [], cancellationSignals: [], logger: logger))
        Signals.startWatching { signal in
            if signal == SIGINT || signal == SIGTERM || signal == SIGQUIT { Task { await group.triggerGracefulShutdown() } }
        }
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            try await server.waitUntilListening()
            guard let url = server.url else { return }
            // Written at once (stdout is a pipe for a script waiting for the URL).
            let line = Array((url + "\n").utf8)
            _ = line.withUnsafeBytes { Glibc.write(1, $0.baseAddress, $0.count) }
            if open {
                do {
                    if let login = try server.loginURL() { Self.openInBrowser(login) }
                } catch {
                    FileStandardError.write("broadcast: \((error as? BroadcastError)?.message ?? "\(error)"): open the URL yourself\n")
                }
            }
            try await tasks.waitForAll()
        }
    }

    /// Runs `xdg-open URL` when it is on PATH (and reaps it when it ends); says so when it is not.
    static func openInBrowser(_ url: String) {
        var search = "/usr/bin:/bin"
        if let value = getenv("PATH") { search = String(cString: value) }
        let candidates = search.split(separator: ":").map { "\($0)/xdg-open" }
        guard let tool = candidates.first(where: { access($0, X_OK) == 0 }) else {
            FileStandardError.write("broadcast: xdg-open is not installed: open the URL yourself\n")
            return
        }
        var pid: pid_t = 0
        let arguments: [UnsafeMutablePointer<CChar>?] = [strdup(tool), strdup(url), nil]
        defer { for argument in arguments { free(argument) } }
        if posix_spawn(&pid, tool, nil, nil, arguments, environ) != 0 {
            FileStandardError.write("broadcast: could not run xdg-open: open the URL yourself\n")
            return
        }
        // Its end is waited for (a zombie otherwise, for the server's whole life).
        let child = pid
        OSThread(name: "bc-xdg-open") {
            var status: Int32 = 0
            while waitpid(child, &status, 0) < 0 && errno == EINTR {}
        }.detach()
    }
}
