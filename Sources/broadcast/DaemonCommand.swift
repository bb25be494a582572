import ArgumentParser
import BroadcastDaemon
import BroadcastOutputs
import BroadcastService
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// `broadcast daemon`: the flags, logging and signals; the daemon itself is `BroadcastDaemon.Daemon`.
struct DaemonCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "daemon",
        abstract: "Run as a background service with a config file and a control socket.",
        discussion: """
            Reads a TOML config (see systemd/broadcast.toml), starts the broadcast, and serves \
            the control API as HTTP/JSON on a Unix socket:
              S=/run/broadcast/control.sock
              curl --unix-socket $S http://localhost/v1/status
              curl --unix-socket $S -X POST http://localhost/v1/broadcast/pause
              curl --unix-socket $S http://localhost/metrics       (Prometheus)
            or with `broadcast status|pause|resume|stop [--socket PATH]`.

            Under systemd (Type=notify) it reports READY=1 once the outputs are up, STATUS= \
            lines, and WATCHDOG=1 only while frames flow. SIGTERM finishes cleanly (encoders \
            flushed, files finalized); SIGHUP (or `broadcast reload`) re-reads the config: \
            outputs, sources and encoder settings (see `broadcast reload --help`).

            Stream keys are never printed (FFmpeg's log lines are scrubbed of them too); an \
            output's on_file_finished command gets only PATH, HOME, USER, LOGNAME, LANG, \
            LANGUAGE, LC_*, TZ, TMPDIR, the desktop session's XDG_RUNTIME_DIR, \
            DBUS_SESSION_BUS_ADDRESS, DISPLAY and WAYLAND_DISPLAY, BROADCAST_FILE and \
            BROADCAST_OUTPUT in its environment and descriptors 0-2. An rtmps:// output checks the server's certificate (tls_ca: a \
            private CA; tls_verify = false: no check, with a warning).
            """
    )

    @Option(help: ArgumentHelp("The TOML config file.", valueName: "file"))
    var config: String

    @Option(name: .customLong("log-level"), help: ArgumentHelp("trace, debug, info, notice, warning, error or critical.", valueName: "level"))
    var logLevel: String = "info"

    func run() async throws {
        let configuration = try DaemonConfiguration.load(path: config, environment: ProcessEnvironment.current())
        guard let level = Logger.Level(rawValue: logLevel.lowercased()) else {
            throw ValueError("invalid --log-level '\(logLevel)': accepted are \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        let logger = Logging.bootstrap(level: level)
        // FFmpeg's protocols name what they open ("Sending publish command for 'KEY'" at debug):
        // every line is scrubbed of the stream keys the config ever named.
        let secrets = StreamSecrets()
        PipelineAssembly.logFFmpeg(into: logger, redact: { secrets.scrub($0) })
        let daemon = Daemon(
            configuration: configuration, environment: { ProcessEnvironment.current() }, metrics: DaemonMetrics.bootstrap(),
            notifier: SystemdNotifier.fromProcessEnvironment(), secrets: secrets, logger: logger)
        Signals.startWatching { signal in
            switch signal {
            case SIGTERM, SIGINT, SIGQUIT:
                logger.notice("\(Signals.name(signal)): shutting down")
                Task { await daemon.shutdown() }
            case SIGHUP:
                daemon.reload()
            default:
                logger.info("\(Signals.name(signal)) ignored")
            }
        }
        do {
            try await daemon.run()
        } catch let failure as DaemonFailure {
            if let message = failure.message { FileStandardError.write("broadcast: error: \(message)\n") }
            throw ExitCode.failure
        }
    }
}
