import Atomics
import BroadcastCapture
import BroadcastKit
import BroadcastComposition
import BroadcastMedia
public import BroadcastOutputs
public import BroadcastService
import Dispatch
public import Logging
import ServiceLifecycle
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The daemon as a library: a checked `DaemonConfiguration` run as a service with its control API,
/// until `shutdown()` (SIGTERM in `broadcast daemon`). `reload()` re-reads the config file (SIGHUP).
/// The command line only parses its flags, installs logging and signals, and calls `run()`; tests
/// run it in-process the same way.
public final class Daemon: Sendable {
    /// The configuration it started with (a reload replaces the controller's, not this).
    public let configuration: DaemonConfiguration
    /// The file `reload()` reads.
    public let configPath: String
    private let environment: @Sendable () -> [String: String]
    private let metrics: DaemonMetrics
    private let notifier: SystemdNotifier
    private let logger: Logger
    let events = ControlEvents()
    /// Made in `run()` (the directories locked first).
    private let controllerState = Mutex<BroadcastController?>(nil)
    /// The running service group, or a shutdown asked for before it ran.
    private let groupState = Mutex<(group: ServiceGroup?, shutdownAsked: Bool)>((nil, false))

    /// The stream URLs' secrets, which FFmpeg's log is scrubbed of (`FFmpegLog.install(_:redact:)`
    /// with `secrets.scrub`); each start and reload adds its outputs'.
    public let secrets: StreamSecrets

    /// `environment` is read at the start and at each reload (${VAR} and ${credential:NAME} in the config).
    public init(
        configuration: DaemonConfiguration, environment: @escaping @Sendable () -> [String: String],
        metrics: DaemonMetrics, notifier: SystemdNotifier, secrets: StreamSecrets = StreamSecrets(), logger: Logger
    ) {
        self.secrets = secrets
        secrets.add(configuration.streamURLs)
        self.configuration = configuration
        self.configPath = configuration.file
        self.environment = environment
        self.metrics = metrics
        self.notifier = notifier
        self.logger = logger
    }

    /// Why the last broadcast ended with an error.
    public var lastFailure: String? { controllerState.withLock { $0 }?.lastFailure }

    /// The status document `GET /v1/status` answers; nil before `run()` made the controller.
    public func status() -> JSONValue? { controllerState.withLock { $0 }?.status() }

    /// Re-reads the config file (SIGHUP): outputs apply to the running broadcast at once (see
    /// `BroadcastController.reload`); `POST /v1/reload` does the same and answers what it did.
    public func reload() {
        controllerState.withLock { $0 }?.reload(path: configPath, environment: environment())
    }

    /// Finishes the broadcast (encoders flushed, files finalized), then the control server; `run()` returns.
    public func shutdown() async {
        let group = groupState.withLock { state -> ServiceGroup? in
            state.shutdownAsked = true
            return state.group
        }
        await group?.triggerGracefulShutdown()
    }

    /// Runs until `shutdown()`: recovers crashed recordings, locks the directories, serves the
    /// control API and (with autostart) starts the broadcast. Throws `DaemonFailure` (exit 1), a
    /// `ValueError` when the broadcast could not start for bad input (exit 2), `BroadcastError`
    /// `.invalidArgument` when another daemon holds a directory (exit 2).
    public func run() async throws {
        let configuration = self.configuration
        let logger = self.logger
        let notifier = self.notifier
        // Outside systemd (which makes them: StateDirectory, RuntimeDirectory) the directories may not exist yet.
        let socketDirectory = String(configuration.socketPath[..<(configuration.socketPath.lastIndex(of: "/") ?? configuration.socketPath.startIndex)])
        let manifests = configuration.manifests
        for directory in Set(manifests.map(\.directory)).sorted() + [socketDirectory] where !directory.isEmpty {
            if let problem = RecordingTemplate.makeDirectories(directory) {
                throw DaemonFailure(problem)
            }
        }
        // One daemon per directory, locked before anything there is touched: a second daemon on the
        // same config ends here (exit 2) instead of "recovering" the first one's live recording.
        let locks = try Self.lock(directories: manifests.map(\.directory), socketPath: configuration.socketPath)
        RecordingRecovery.recover(manifests, logger: logger) { path in
            // Finalizing a long recording takes a while: ask systemd for more time to start.
            notifier.send("EXTEND_TIMEOUT_USEC=\(Self.recoveryTimeoutMicroseconds)\nSTATUS=recovering \(path)")
        }
        // Files whose on_file_finished command an earlier run queued and never ran (cut short at its
        // end, or a crash): run now, on their hooks' own threads.
        for output in configuration.outputs {
            guard let argv = output.onFileFinished, !argv.isEmpty, case .recording(let template) = output.kind else { continue }
            FileFinishedHook(arguments: argv, outputName: output.name, timeout: output.hookTimeout,
                             manifest: RecordingManifest(template: template), logger: logger).runPendingCommands()
        }
        let token = ControlToken(configuration.token)
        let controller = BroadcastController(
            config: configuration, locks: locks, events: events, controlToken: token, secrets: secrets, logger: logger)
        controllerState.withLock { $0 = controller }
        let environment = self.environment
        let configPath = self.configPath
        let server = try Self.controlServer(
            configuration, token: token, controller: controller, events: events, metrics: metrics,
            reload: { controller.reload(path: configPath, environment: environment(), trigger: "POST /v1/reload") }, logger: logger)
        let service = DaemonService(
            controller: controller, notifier: notifier, server: server, autostart: configuration.autostart, configPath: configPath, logger: logger)
        // Shut down in reverse: the broadcast finishes first (its last events published), then the
        // watcher, then the control server (event streams drained, open requests answered).
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: [
                    .init(service: server, successTerminationBehavior: .gracefullyShutdownGroup),
                    .init(service: EventWatcher(controller: controller), successTerminationBehavior: .gracefullyShutdownGroup),
                    // A start that fails shuts the rest down gracefully (no cancellation errors logged).
                    .init(service: service, successTerminationBehavior: .gracefullyShutdownGroup, failureTerminationBehavior: .gracefullyShutdownGroup),
                ],
                gracefulShutdownSignals: [],
                cancellationSignals: [],
                logger: logger
            )
        )
        let asked = groupState.withLock { state -> Bool in
            state.group = group
            return state.shutdownAsked
        }
        if asked { Task { await group.triggerGracefulShutdown() } }
        do {
            try await group.run()
        } catch let error as BroadcastError {
            // The control socket could not be bound: exit 1 with one line.
            throw DaemonFailure(error.message)
        }
        if let failure = controller.lastFailure {
            logger.error("the broadcast ended with an error: \(failure)")
        }
        // The files are final; their commands get a bounded wait (systemd's stop timeout is longer).
        FileFinishedHook.finishAll(within: FileFinishedHook.shutdownWait, logger: logger)
    }
}

/// What a reload did: refused (the running broadcast and config untouched), taken for the next
/// start (no broadcast runs), or applied to the running broadcast (what became of each output and
/// source).
enum ReloadOutcome: Equatable {
    case refused(String)
    case nextStart
    case applied(ReloadReport)
}

/// What a reload did to a running broadcast, per output and per changed source: the `POST
/// /v1/reload` answer and the `reload` event say it, "applied" only when all of it runs now.
struct ReloadReport: Equatable {
    /// The outputs running now, by name.
    var outputs: [String]
    /// Each output the config names or the broadcast ran: unchanged, added, replaced, removed,
    /// kept (its new settings could not start; it goes on with the old ones) or failed (a new one
    /// that could not start).
    var changes: [OutputChange]
    /// Each source the config changed: changed, kept (the old one again) or lost.
    var sources: [SourceChange]
    /// Changes that wait for the next start, one sentence each.
    var nextStart: [String]
    /// Set when the new output set was not applied by the time of the answer (why).
    var pending: String?

    /// Everything the new config asks for runs now.
    var complete: Bool {
        pending == nil && nextStart.isEmpty && changes.allSatisfy { $0.result != .kept && $0.result != .failed }
            && sources.allSatisfy { $0.result == .changed }
    }

    /// The answer's and the event's fields after `reloaded`/`trigger`.
    var fields: [(String, JSONValue)] {
        var fields: [(String, JSONValue)] = [
            ("complete", .bool(complete)),
            ("outputs", .array(outputs.map { .string($0) })),
            ("changes", .array(changes.map { change in
                .object([("output", .string(change.name)), ("result", .string(change.result.rawValue))]
                    + (change.reason.map { [("reason", JSONValue.string($0))] } ?? []))
            })),
            ("sources", .array(sources.map { change in
                .object([
                    ("source", .string(change.key)), ("was", .string(change.was)), ("now", .string(change.now)),
                    ("result", .string(change.result.rawValue)),
                ] + (change.reason.map { [("reason", JSONValue.string($0))] } ?? []))
            })),
            ("next_start", .array(nextStart.map { .string($0) })),
        ]
        if let pending { fields.append(("pending", .string(pending))) }
        return fields
    }
}

/// The daemon could not go on: exit 1, with one line when `message` is set (else it was logged).
public struct DaemonFailure: Error, CustomStringConvertible {
    public let message: String?
    public init(_ message: String?) { self.message = message }
    public var description: String { message ?? "the daemon failed" }
}

extension Daemon {
    /// How much more time systemd is asked for before each recording crash recovery finalizes.
    static let recoveryTimeoutMicroseconds = 120_000_000

    /// `/run/broadcast/.control.sock.lock` for `/run/broadcast/control.sock`.
    static func socketLockPath(_ socketPath: String) -> String {
        guard let slash = socketPath.lastIndex(of: "/") else { return ".\(socketPath).lock" }
        return "\(socketPath[...slash]).\(socketPath[socketPath.index(after: slash)...]).lock"
    }

    /// Locks each directory (`InstanceLock`) and the control socket (`.SOCKET.lock`); a lock held
    /// by another process is exit 2 with one line naming its pid.
    static func lock(directories: [String], socketPath: String) throws -> DirectoryLocks {
        let locks = DirectoryLocks()
        try locks.acquire(directories: directories)
        do {
            locks.keep(try InstanceLock(path: Self.socketLockPath(socketPath), subject: "control socket \(socketPath)"), for: socketPath)
        } catch {
            throw BroadcastError(.invalidArgument, error.description)
        }
        return locks
    }

    /// The control API's server; a socket that cannot be used ends the daemon with exit code 1.
    static func controlServer(
        _ configuration: DaemonConfiguration,
        token: ControlToken,
        controller: BroadcastController,
        events: ControlEvents,
        metrics: DaemonMetrics,
        reload: @escaping @Sendable () -> ReloadOutcome,
        logger: Logger
    ) throws -> ControlServer {
        do {
            return try ControlServer(
                socketPath: configuration.socketPath,
                mode: configuration.socketMode,
                group: configuration.socketGroup?.id,
                tcp: configuration.tcp.map { ($0.host, $0.port) },
                token: token,
                events: events,
                snapshot: { controller.status() },
                publicPaths: ControlPage.publicPaths,
                logger: logger
            ) { request in
                let response = ControlAPI.handle(request, controller: controller, metrics: metrics, reload: reload)
                // What the request changed is published before it is answered.
                if request.method == "POST" { controller.publishChanges() }
                return response
            }
        } catch {
            throw DaemonFailure(error.message)
        }
    }
}

public enum ProcessEnvironment {
    public static func current() -> [String: String] {
        var result: [String: String] = [:]
        var pointer = environ
        while let entry = pointer.pointee {
            let text = String(cString: entry)
            if let eq = text.firstIndex(of: "=") { result[String(text[..<eq])] = String(text[text.index(after: eq)...]) }
            pointer += 1
        }
        return result
    }
}

/// The service systemd sees: READY once up, WATCHDOG while frames flow, STOPPING on the way out,
/// and the broadcast finished cleanly (encoders flushed, files finalized) before `run` returns.
struct DaemonService: Service {
    let controller: BroadcastController
    let notifier: SystemdNotifier
    let server: ControlServer
    let autostart: Bool
    let configPath: String
    let logger: Logger

    func run() async throws {
        // The API is up before the broadcast starts (a client can watch it start).
        try await server.waitUntilListening()
        logger.notice("control API on \(server.socketPath)")
        let marked = ProcessDescriptors.markCloseOnExec()
        logger.debug("\(marked) descriptors (SwiftNIO's) marked close-on-exec")
        if autostart {
            do {
                try await offThePool { try controller.start() }
            } catch let error as ValueError {
                // A source the config names that refuses at start (the ScreenCast portal refused or
                // was cancelled, a device that went away since the check): bad input, exit 2, one line.
                throw ValueError("\(configPath): the broadcast could not start: \(error)")
            } catch let error as OptionError {
                throw ValueError("\(configPath): the broadcast could not start: \(error.option.key): \(error.configMessage)")
            } catch {
                logger.error("the broadcast could not start: \(error)")
                throw DaemonFailure(nil)
            }
            controller.publishChanges()
        }
        notifier.ready(status: controller.statusLine())
        // Ping at half the watchdog interval; without a watchdog, refresh STATUS every few seconds.
        let period = notifier.watchdogNanoseconds.map { max($0 / 2, 100_000_000) } ?? 2_000_000_000
        var lastDelivered = controller.deliveredFrames()
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: .nanoseconds(period)) }
            if Task.isShuttingDownGracefully || Task.isCancelled { break }
            let delivered = controller.deliveredFrames()
            // A hung capture stops the pings, so systemd restarts us; a deliberate pause does not.
            if delivered > lastDelivered || !controller.expectsFrames() {
                notifier.watchdog()
            } else {
                logger.warning("no frames since the last check: not telling the watchdog")
            }
            lastDelivered = delivered
            notifier.status(controller.statusLine())
        }
        notifier.stopping(status: "finishing: flushing encoders, finalizing recordings")
        try await offThePool { controller.stop() }
        controller.publishChanges()
    }
}

/// Runs blocking work (a start waits for the first buffer, a stop joins threads and finalizes
/// files) on a dispatch thread, not on Swift's cooperative pool (two threads on a 2-core machine),
/// which the control server's requests need meanwhile.
func offThePool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global().async { continuation.resume(with: Result { try work() }) }
    }
}

/// Publishes the broadcast's changes of state as events: every 50 ms it reads the session's and
/// outputs' atomics (nothing on the data path waits for it) and publishes what differs from the
/// last look. Control actions publish at once as well (`publishChanges` after each POST).
struct EventWatcher: Service {
    let controller: BroadcastController

    func run() async throws {
        // Cancelled too (another service failed: the group cancels the rest rather than shutting
        // down gracefully): the cancelled sleep returns at once, so without this the loop spins.
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            // The look takes the controller's lock for a moment: off the cooperative pool, where
            // even that moment costs the control server's requests nothing.
            try await offThePool { controller.publishChanges() }
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: .milliseconds(50)) }
        }
        controller.publishChanges()
    }
}

/// Owns the running broadcast for the control API. Its command side: start, pause, resume, stop,
/// an output's pause, reload, audio levels, sync offsets, markers. Its one read: `snapshot()`, which
/// `DaemonReadModel` turns into the status, /metrics, the events and STATUS=. Control calls come
/// from the control server's thread and signal threads; the broadcast itself runs on a thread of
/// its own. (The control plane may lock; the data path never does.)
final class BroadcastController: Sendable {
    private struct Running: @unchecked Sendable {
        let session: BroadcastSession
        let counters: EncodingCounters
        let thread: OSThread
        let startedAt: Int64
        let primaryType: SampleBufferType
        let outputControl: OutputControl
        var outputs: [Output] { outputControl.outputs }
        /// The config entries the running outputs were made from, by name (for SIGHUP's comparison).
        var definitions: [String: DaemonConfiguration.Output]
        /// ALSA sources, whose clock drift against the monotonic clock the status reports.
        var audioDevices: [ALSASource]
        /// What the running sources were made from (a reload compares; see `SourceReload`).
        var sourceSettings: SourceSettings
        /// The sizes the memory budget gave; outputs added by SIGHUP get them too.
        let memoryPlan: MemoryPlan
        /// The composite picture, when the video has layers or scenes (a reload does not replace
        /// it: a change of layers waits for the next start). Kept here so reads (status, events,
        /// metrics) never go through the session's source list, which a swap holds.
        var composite: LayeredVideoSource?
        /// The audio sources' volumes and mutes (`POST /v1/audio/...`), and which sources there are.
        var audioControl: AudioSourceControl? = nil
        /// The sources' sync offsets (`POST /v1/audio/{mic,app}/offset`, `/v1/video/offset`, a reload).
        var offsetControl: SourceOffsetControl? = nil
        var audioSources: [SampleBufferType] = []
        /// The broadcast's video encode (its picture's size, rate and colour: what an output's own
        /// encode added by a reload is made from); nil without video.
        var video: VideoEncoderSettings? = nil
        /// Each video encode and the outputs it feeds (the status).
        var encodes: VideoEncodeList? = nil
        /// The markers taken in this broadcast.
        let markers = MarkerLog()
    }

    private let state: Mutex<(config: DaemonConfiguration, running: Running?, starting: Bool)>
    /// The directories this daemon holds (recordings' base directories, the socket).
    private let locks: DirectoryLocks
    /// Why the last broadcast ended with an error; set by the broadcast's thread.
    private let failure = Mutex<String?>(nil)
    private let logger: Logger
    let startedAt = MonotonicClock().now()
    let events: ControlEvents
    /// What the last look published from (see `publishChanges`).
    private let published = Mutex(PublishedState())
    /// Held for a whole reload: SIGHUP and `POST /v1/reload` apply one after the other.
    private let reloading = Mutex(())

    /// The control server's TCP token, which a reload replaces.
    private let controlToken: ControlToken
    /// What FFmpeg's log is scrubbed of: a reload adds the new outputs' keys.
    private let secrets: StreamSecrets
    /// The control page's preview (`GET /v1/preview.jpg`), audio meters and status ticks, fed by
    /// every broadcast this controller starts.
    let page: PageFeed

    init(
        config: DaemonConfiguration, locks: DirectoryLocks, events: ControlEvents = ControlEvents(),
        controlToken: ControlToken? = nil, secrets: StreamSecrets = StreamSecrets(), logger: Logger
    ) {
        self.secrets = secrets
        self.state = Mutex((config, nil, false))
        self.locks = locks
        self.events = events
        self.controlToken = controlToken ?? ControlToken(config.token)
        self.logger = logger
        self.page = PageFeed(events: events)
        page.start { [weak self] in self?.status() }
    }

    deinit { page.stop() }

    var lastFailure: String? { failure.withLock { $0 } }

    /// Builds sources, the encoding handler and a new session from the config and runs it.
    func start() throws {
        // The lock is held only to claim the start and to record its result: opening devices and
        // waiting for the first buffer happen outside it, so status, events and metrics go on.
        let config = try state.withLock { state -> DaemonConfiguration in
            if let running = state.running, running.session.state != .finished {
                throw BroadcastError(.illegalTransition, "cannot start while \(running.session.state): the broadcast is already running")
            }
            if state.starting {
                throw BroadcastError(.illegalTransition, "cannot start: the broadcast is already starting")
            }
            state.starting = true
            return state.config
        }
        defer { state.withLock { $0.starting = false } }
        let sources = config.sources
        let outputs = try Self.outputConfigurations(config.outputs)
        let assembly = try PipelineAssembly(
            sources: sources, encoder: config.encoder, outputs: outputs, encodes: config.outputEncodes, liveTuning: true,
            budget: config.memoryBudgetBytes, replayLimitsSet: config.replayLimitsSet, logger: logger)
        let captureSources = assembly.sources
        let plan = assembly.plan
        let hasVideo = captureSources.contains { $0.type == .video }
        assembly.logPlan(logger, quietly: .info)
        let handler = assembly.makeHandler(logger: logger)
        let counters = handler.counters
        let levels = page.levels
        handler.audioTrackTap = { track, audio in levels.offer(track: track, audio) }
        page.setTrackTitles(handler.audioTrackTitlesReader)
        // The last broadcast's picture is not this one's.
        page.preview.forget()
        let monitored = MonitoredHandler(handler, preview: page.preview, levels: levels)
        let session = assembly.makeSession(handler: monitored, logger: logger)
        let setup = config.setup
        let logger = self.logger
        let thread = OSThread(name: "bc-session") { [weak self] in
            do {
                let summary = try session.run(setupInfo: setup)
                let encoded = counters.snapshot()
                logger.notice(
                    "broadcast finished (\(summary.reason.rawValue)): \(encoded.videoFramesEncoded) video frames, \(encoded.audioFramesEncoded) audio frames encoded")
            } catch {
                logger.error("broadcast failed: \(error)")
                self?.failure.withLock { $0 = "\(error)" }
            }
        }
        // Outputs are up once the first buffer went through the handler (or the start failed).
        let deadline = MonotonicClock().now() + 10_000_000_000
        while session.state != .finished && !session.statistics().values.contains(where: { $0.delivered > 0 })
            && MonotonicClock().now() < deadline
        {
            usleep(2000)
        }
        if session.state == .finished {
            thread.join()
            throw BroadcastError(.outputFailed, failure.withLock { $0 } ?? "the broadcast ended as soon as it started")
        }
        let running = Running(
            session: session,
            counters: counters,
            thread: thread,
            startedAt: MonotonicClock().now(),
            primaryType: hasVideo ? .video : captureSources[0].type,
            outputControl: handler.outputControl,
            definitions: Dictionary(config.outputs.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first }),
            audioDevices: captureSources.compactMap { $0.source as? ALSASource },
            sourceSettings: sources,
            memoryPlan: plan
        )
        var withAudio = running
        withAudio.video = assembly.configuration.video
        withAudio.encodes = handler.videoEncodes
        withAudio.audioControl = handler.audioControl
        withAudio.offsetControl = handler.offsetControl
        withAudio.audioSources = assembly.configuration.audioSources
        withAudio.composite = captureSources.lazy.compactMap { $0.source as? LayeredVideoSource }.first
        state.withLock { $0.running = withAudio }
        failure.withLock { $0 = nil }
        logger.notice("broadcast started: \(outputs.map(\.name).joined(separator: ", "))")
    }

    /// Pauses or resumes one output while the broadcast and the other outputs go on.
    func setOutput(named name: String, paused: Bool) throws {
        guard let running = state.withLock({ $0.running }), running.session.state != .finished else {
            throw BroadcastError(.illegalTransition, "cannot \(paused ? "pause" : "resume") output \(name): no broadcast is running")
        }
        guard let output = running.outputs.first(where: { $0.name == name }) else {
            throw BroadcastError(
                .invalidArgument,
                "no output named \(name): outputs are \(running.outputs.map(\.name).joined(separator: ", "))")
        }
        if paused == output.isPaused {
            throw BroadcastError(.illegalTransition, "output \(name) is \(paused ? "already paused" : "not paused")")
        }
        if paused { output.pause() } else { output.resume() }
    }

    /// The running broadcast's composite picture, when it has layers (see `DaemonScenes`).
    func runningComposite() -> LayeredVideoSource? {
        guard let running = state.withLock({ $0.running }), running.session.state != .finished else { return nil }
        return running.composite
    }

    /// Sets an audio source's volume (`mic`, `app`, -60 to +20 dB) in the running broadcast, from
    /// its next buffer on; its mute stays as it is. Throws as `setAudio(_:muted:)`.
    func setAudio(_ source: String, volume decibels: Double) throws {
        let (control, type) = try audioControl(source, doing: "set the volume of")
        control.setVolume(decibels, of: type)
        logger.notice("\(source) audio at \(decibels) dB")
        publishChanges()
    }

    /// The running broadcast's audio control and the source `source` names (`mic`, `app`).
    private func audioControl(_ source: String, doing action: String) throws -> (AudioSourceControl, SampleBufferType) {
        let type: SampleBufferType
        switch source {
        case "mic": type = .audioMic
        case "app": type = .audioApp
        default: throw BroadcastError(.invalidArgument, "unknown audio source '\(source)': use mic or app")
        }
        guard let running = state.withLock({ $0.running }), running.session.state != .finished,
            let control = running.audioControl
        else {
            throw BroadcastError(.illegalTransition, "cannot \(action) \(source): no broadcast is running")
        }
        guard running.audioSources.contains(type) else {
            throw BroadcastError(.invalidArgument, "cannot \(action) \(source): the broadcast has no \(source) audio")
        }
        return (control, type)
    }

    /// Mutes or unmutes an audio source (`mic`, `app`) of the running broadcast, from its next
    /// buffer on. Throws `illegalTransition` when none runs, `invalidArgument` for a source it has not.
    func setAudio(_ source: String, muted: Bool) throws {
        let (control, type) = try audioControl(source, doing: muted ? "mute" : "unmute")
        control.setMuted(muted, of: type)
        logger.notice("\(source) audio \(muted ? "muted" : "unmuted")")
        publishChanges()
    }

    /// Sets the sync offset of a source (`mic`, `app`, `video`) of the running broadcast from
    /// `text` ("200ms", "-0.15s", "0"), from its next buffer on. Throws `invalidArgument` for a
    /// value out of range or malformed or a source the broadcast has not, `illegalTransition`
    /// when none runs.
    func setOffset(_ source: String, _ text: String) throws {
        let type: SampleBufferType
        let spec: OptionSpec<Int64>
        switch source {
        case "mic": (type, spec) = (.audioMic, Options.micOffset)
        case "app": (type, spec) = (.audioApp, Options.appOffset)
        case "video": (type, spec) = (.video, Options.videoOffset)
        default: throw BroadcastError(.invalidArgument, "unknown source '\(source)': use mic, app or video")
        }
        let offset: Int64
        do {
            offset = try spec.parse(text)
        } catch {
            throw BroadcastError(.invalidArgument, error.description.replacing("invalid \(spec.name.flag) ", with: "invalid \(source) offset ", maxReplacements: 1))
        }
        guard let running = state.withLock({ $0.running }), running.session.state != .finished,
            let control = running.offsetControl
        else {
            throw BroadcastError(.illegalTransition, "cannot set the \(source) offset: no broadcast is running")
        }
        guard type == .video ? running.primaryType == .video : running.audioSources.contains(type) else {
            throw BroadcastError(.invalidArgument, "cannot set the \(source) offset: the broadcast has no \(source == "video" ? "video" : "\(source) audio")")
        }
        if control.set(offset, of: type) {
            logger.notice("\(source) offset \(Values.offsetText(offset))")
        }
        publishChanges()
    }

    /// A reload's changed volumes, mutes and sync offsets (`ReloadPlan.levels`, `offsets`) apply
    /// at once, from each source's next buffer; what the reload did not change stays as the control
    /// API left it.
    private func apply(_ plan: ReloadPlan, to running: Running, trigger: String) {
        if let control = running.audioControl {
            for change in plan.levels where running.audioSources.contains(change.type) {
                control.update(change.type) { now in
                    if let volume = change.volume { now.volumeDecibels = volume }
                    if let muted = change.muted { now.muted = muted }
                }
                let now = control.level(of: change.type)
                logger.notice("\(trigger): \(change.type == .audioApp ? "app" : "mic") audio at \(now.volumeDecibels) dB\(now.muted ? ", muted" : "")")
            }
        }
        if let control = running.offsetControl {
            for change in plan.offsets {
                control.set(change.nanoseconds, of: change.type)
                let name = change.type == .video ? "video" : change.type == .audioApp ? "app" : "mic"
                logger.notice("\(trigger): \(name) offset \(Values.offsetText(change.nanoseconds))")
            }
        }
    }

    /// True while a broadcast with video runs (paused too): only then has the preview a picture to
    /// show, never one of a broadcast that ended.
    var runsVideo: Bool {
        guard let running = state.withLock({ $0.running }) else { return false }
        return running.session.state != .finished && running.primaryType == .video
    }

    /// The running broadcast's outputs; nil when no broadcast runs.
    /// The running broadcast's outputs and its markers; nil when none runs.
    func runningMarkers() -> ([Output], MarkerLog)? {
        guard let running = state.withLock({ $0.running }), running.session.state != .finished else { return nil }
        return (running.outputs, running.markers)
    }

    func runningOutputs() -> [Output]? {
        guard let running = state.withLock({ $0.running }), running.session.state != .finished else { return nil }
        return running.outputs
    }

    func pause() throws {
        guard let session = state.withLock({ $0.running?.session }) else {
            throw BroadcastError(.illegalTransition, "cannot pause: no broadcast is running")
        }
        try session.pause()
    }

    func resume() throws {
        guard let session = state.withLock({ $0.running?.session }) else {
            throw BroadcastError(.illegalTransition, "cannot resume: no broadcast is running")
        }
        try session.resume()
    }

    /// Finishes the broadcast and waits for its thread (encoders flushed, files finalized).
    func stop() {
        let running = state.withLock { $0.running }
        guard let running else { return }
        _ = try? running.session.finish()
        running.thread.join()
    }

    /// The outputs a config names, recordings' paths expanded for now.
    static func outputConfigurations(_ entries: [DaemonConfiguration.Output]) throws -> [OutputConfiguration] {
        try entries.map { output in
            switch output.kind {
            case .recording(let template):
                let segments = output.segment.map {
                    RecordingSegments(
                        pathTemplate: template,
                        length: $0.nanoseconds.map { .nanoseconds($0) },
                        retainSeconds: output.retainFor.map { Int64($0.seconds) },
                        retainBytes: output.retainBytes
                    )
                }
                if let replay = output.replay {
                    var configuration = OutputConfiguration(
                        name: output.name, destination: .file(template),
                        replay: ReplaySettings(seconds: replay.seconds, maxBytes: output.maxMemory ?? ReplaySettings.defaultMaxBytes),
                        onFileFinished: output.onFileFinished, manifest: RecordingManifest(template: template))
                    configuration.hookTimeout = output.hookTimeout
                    return configuration
                }
                // Without overwrite an existing file is never touched: the recording takes a new name
                // beside it, one never given out in the directory before.
                let manifest = RecordingManifest(template: template)
                let path = output.overwrite
                    ? RecordingRetention.expand(template) : RecordingRetention.nextPath(template, manifest: manifest)
                // Conversions in the directories (`%Y/%m/rec.mp4`) name directories to create.
                if let problem = RecordingTemplate.makeParentDirectories(of: path) {
                    throw BroadcastError(.outputFailed, "output \(output.name): \(problem)")
                }
                var configuration = OutputConfiguration(
                    name: output.name, destination: .file(path), segments: segments, overwrite: output.overwrite,
                    onFileFinished: output.onFileFinished, manifest: manifest)
                configuration.hookTimeout = output.hookTimeout
                return configuration
            case .live(let url):
                let destination = try OutputDestination.parse(url).withWHIPToken(output.token)
                // The config check refuses this; a file made of a URL without a scheme never is.
                guard destination.isLive else { throw BroadcastError(.invalidArgument, "output \(output.name): url is not a stream URL (no scheme)") }
                var live = LiveStreamSettings()
                live.tls = output.tls
                live.allowPlainHTTP = output.allowPlainHTTP
                return OutputConfiguration(name: output.name, destination: destination, live: live)
            }
        }
    }

    /// SIGHUP or `POST /v1/reload`: re-reads the config. The outputs apply to the running broadcast
    /// at once: an output whose settings did not change goes on untouched (a recording is not
    /// interrupted), removed ones end, new ones start on a fresh keyframe. A changed source is
    /// swapped alone (`SourceReload`); the sources the running broadcast holds are not opened
    /// again. Encoder settings, the video size and rate apply from the next start. One reload at a
    /// time (a SIGHUP during an API reload waits for it); `trigger` starts its log lines.
    @discardableResult
    func reload(path: String, environment: [String: String], trigger: String = "SIGHUP") -> ReloadOutcome {
        let outcome = reloading.withLock { _ in reloadAlone(path: path, environment: environment, trigger: trigger) }
        // Watchers (`status --watch`, a dashboard) see every reload, a SIGHUP's too.
        var fields: [(String, JSONValue)] = [("trigger", .string(trigger))]
        switch outcome {
        case .refused(let message): fields += [("result", .string("refused")), ("message", .string(message))]
        case .nextStart: fields += [("result", .string("next start"))]
        case .applied(let report): fields += [("result", .string(report.complete ? "applied" : "partly applied"))] + report.fields
        }
        _ = events.publish("reload", fields)
        return outcome
    }

    private func reloadAlone(path: String, environment: [String: String], trigger: String) -> ReloadOutcome {
        let fresh: DaemonConfiguration
        let sourceReload: SourceReload?
        do {
            let holding = state.withLock { $0.running }.flatMap { $0.session.state == .finished ? nil : $0 }
            fresh = try DaemonConfiguration.load(path: path, environment: environment, openingDevices: holding == nil)
            secrets.add(fresh.streamURLs)
            sourceReload = try holding.map {
                try SourceReload(
                    running: $0.sourceSettings, types: Set($0.session.currentSources.map(\.type)), fresh: fresh.sources, logger: logger)
            }
        } catch {
            logger.error("\(trigger): config not reloaded: \(error)")
            return .refused("\(error)")
        }
        // The control socket and TCP listener are bound once: a change to them refuses the reload
        // (restart needed); the token alone is replaced now.
        if let problem = Self.controlChangeNeedingRestart(from: state.withLock { $0.config }, to: fresh) {
            logger.error("\(trigger): config not reloaded: \(problem)")
            return .refused("\(problem)")
        }
        // New directories are locked like the first ones; one held by another daemon refuses the reload.
        do {
            for directory in fresh.manifests.map(\.directory) {
                if let problem = RecordingTemplate.makeDirectories(directory) { throw BroadcastError(.outputFailed, problem) }
            }
            try locks.acquire(directories: fresh.manifests.map(\.directory))
        } catch {
            logger.error("\(trigger): config not reloaded: \(error)")
            return .refused("\(error)")
        }
        let (running, previous) = state.withLock { state -> (Running?, DaemonConfiguration) in
            let previous = state.config
            state.config = fresh
            return (state.running, previous)
        }
        if controlToken.current != fresh.token {
            controlToken.replace(with: fresh.token)
            logger.notice("\(trigger): control token replaced: the old one is refused from now on")
        }
        guard let running, running.session.state != .finished else {
            logger.notice("\(trigger): config reloaded; it applies from the next start")
            return .nextStart
        }
        // The plan: unchanged outputs keep their configuration (a recording keeps the file it
        // writes); one whose new entry cannot be made keeps running as it is (a reload ends only
        // what it leaves out); levels and offsets the reload changed; encode keys for the next start.
        let plan = ReloadPlan(
            previous: previous, fresh: fresh,
            running: ReloadPlan.Running(
                outputs: Dictionary(running.outputs.map { ($0.name, $0.configuration) }, uniquingKeysWith: { first, _ in first }),
                definitions: running.definitions, video: running.video,
                size: { running.memoryPlan.sized($0, replayLimitSet: $1) }))
        for change in plan.unmade {
            logger.error("\(trigger): output \(change.name): \(change.reason ?? "")\(change.result == .failed ? "; not added" : "; it goes on with its old settings")")
        }
        let desired = plan.desired, unmade = plan.unmade
        // Applied on the session's thread between two buffers, or at once while paused; the
        // answer waits for what it did (the swap of a device waits its own way, below).
        let request = running.outputControl.reconfigure(desired)
        running.session.requestControl()
        let deadline = MonotonicClock().now() + Self.reloadPatience
        while request.result == nil && running.session.state != .finished && MonotonicClock().now() < deadline {
            usleep(2000)
        }
        var changes = request.result ?? []
        for change in unmade {
            if let index = changes.firstIndex(where: { $0.name == change.name }) { changes[index] = change } else { changes.append(change) }
        }
        var pending: String?
        if request.result == nil {
            pending =
                running.session.state == .finished
                ? "the broadcast ended before the outputs changed"
                : "the outputs change before the broadcast's next buffer; its thread was busy for \(Self.reloadPatience / 1_000_000_000) s"
        }
        let applied = sourceReload?.apply(to: running.session, logger: logger)
        apply(plan, to: running, trigger: trigger)
        state.withLock { state in
            var definitions = Dictionary(fresh.outputs.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
            // An output still on its old settings is compared with them at the next reload.
            for change in changes where change.result == .kept || change.result == .failed {
                definitions[change.name] = running.definitions[change.name]
            }
            state.running?.definitions = definitions
            if let applied, state.running?.session === running.session {
                state.running?.sourceSettings = applied.settings
                state.running?.audioDevices = running.session.currentSources.compactMap { $0.source as? ALSASource }
            }
        }
        let report = ReloadReport(
            outputs: running.outputs.map(\.name), changes: changes, sources: applied?.changes ?? [],
            nextStart: (sourceReload?.deferred ?? []) + plan.nextStart, pending: pending)
        logger.notice(
            "\(trigger): config reloaded\(report.complete ? "" : ", not all of it now"); outputs now \(report.outputs.joined(separator: ", "))")
        return .applied(report)
    }

    /// How long a reload waits for the session's thread to apply the new output set.
    static let reloadPatience: Int64 = 30_000_000_000

    /// A [control] change a reload cannot apply (the socket, its mode, the TCP listener are bound
    /// once), as a config error naming the key: restart needed. nil when only the token changed.
    static func controlChangeNeedingRestart(from old: DaemonConfiguration, to new: DaemonConfiguration) -> ConfigError? {
        let changed: String? =
            old.socketPath != new.socketPath ? "socket" : old.socketMode != new.socketMode ? "socket_mode"
            : old.socketGroup != new.socketGroup ? "socket_group" : old.tcp != new.tcp ? "tcp" : nil
        guard let changed else { return nil }
        let key = "control.\(changed)"
        return ConfigError(
            file: new.file, line: new.lines[key] ?? old.lines[key] ?? 0, key: key,
            message: "changed, which applies only at a restart: restart needed (a reload changes control.token, not the socket or TCP listener)")
    }


    func deliveredFrames() -> Int {
        guard let running = state.withLock({ $0.running }) else { return 0 }
        return running.session.statistics()[running.primaryType]?.delivered ?? 0
    }

    /// False when no frames are due: nothing runs, or the broadcast is paused or finished.
    func expectsFrames() -> Bool {
        state.withLock { $0.running?.session.state == .started }
    }

    /// One look at the daemon's state for the read side (`DaemonReadModel`): the controller's lock
    /// for a moment (the running broadcast and the config), then the session's, outputs' and
    /// sources' atomics, each read once. `readingMemory`: the process's footprint from /proc too
    /// (the status and /metrics show it; the events, looked at 20 times a second, do not).
    func snapshot(readingMemory: Bool = true) -> DaemonSnapshot {
        let (running, budget) = state.withLock { ($0.running, $0.config.memoryBudgetBytes) }
        let failure = lastFailure
        let now = MonotonicClock().now()
        var snapshot = DaemonSnapshot(
            uptimeSeconds: Double(now - startedAt) / 1e9, failure: failure, memoryBudgetBytes: budget,
            memory: readingMemory ? Self.processFootprint() : nil, eventClients: events.clientCount)
        guard let running else { return snapshot }
        let session = running.session.state
        // Scenes and layers only while the broadcast runs (see `runningComposite`).
        let composite = session == .finished ? nil : running.composite
        snapshot.broadcast = DaemonSnapshot.Broadcast(
            session: ObjectIdentifier(running.session),
            startedAt: running.startedAt,
            state: session,
            elapsedSeconds: Double(now - running.startedAt) / 1e9,
            types: running.session.statistics().sorted { $0.key.rawValue < $1.key.rawValue }.map { ($0.key.rawValue, $0.value) },
            encoding: running.counters.snapshot(),
            audioDrift: running.audioDevices.compactMap { device in device.statistics.driftPPM.map { (device.name, $0) } },
            composite: composite.map {
                .init(scene: $0.scene, shownScene: $0.shownSceneName, scenes: $0.scenes.map(\.name), layers: $0.layerStatuses)
            },
            outputs: running.outputs.map { output in
                let files = output.finishedFiles
                return .init(
                    serial: output.serial, statistics: output.statistics(), state: output.state, paused: output.isPaused,
                    isReplay: output.isReplay, replay: output.replayStatistics(), files: files.count, lastFile: files.last,
                    fileMarks: output.takesMarks && !output.isReplay ? output.marks : nil)
            },
            encodes: (running.encodes?.all ?? []).map {
                .init(settings: $0.settings, outputs: $0.outputs, bitrate: $0.bitrate, frames: $0.frames)
            },
            marks: running.markers.all,
            audio: Self.audioSourceNames(running.audioSources).map {
                ($0.name, running.audioControl?.level(of: $0.type) ?? AudioLevel())
            },
            offsets: Self.offsetSources(running).map { ($0.name, running.offsetControl?.offset(of: $0.type) ?? 0) })
        return snapshot
    }

    /// The status document (`GET /v1/status`, the POST routes' answers, the page's ticks).
    func status() -> JSONValue { DaemonReadModel.status(snapshot()) }

    /// The figures /metrics exports, from the same kind of snapshot as the status.
    func metricsFigures() -> MetricsFigures { DaemonReadModel.metricsFigures(snapshot()) }

    /// The state events are made of.
    func eventSnapshot() -> EventSnapshot { DaemonReadModel.events(snapshot(readingMemory: false)) }

    /// systemd's STATUS= line.
    func statusLine() -> String { DaemonReadModel.statusLine(snapshot(readingMemory: false)) }

    /// Publishes what changed since the last look (one event per change, in a fixed order:
    /// broadcast, outputs, devices, files). Serialized: the watcher and control actions call it.
    func publishChanges() {
        published.withLock { last in
            let now = eventSnapshot()
            for (type, fields) in now.changes(since: last.snapshot) { events.publish(type, fields) }
            last.snapshot = now
        }
    }

    /// The sources a sync offset can be set for: the video (when the broadcast has video), then the audio.
    private static func offsetSources(_ running: Running) -> [(name: String, type: SampleBufferType)] {
        (running.primaryType == .video ? [("video", SampleBufferType.video)] : []) + audioSourceNames(running.audioSources)
    }

    /// The audio sources as the control API names them.
    static func audioSourceNames(_ types: [SampleBufferType]) -> [(name: String, type: SampleBufferType)] {
        [("mic", SampleBufferType.audioMic), ("app", .audioApp)].filter { types.contains($0.1) }
    }
}

/// The instance locks a daemon holds, by directory (see `InstanceLock`); held until the process ends.
final class DirectoryLocks: Sendable {
    private let held = Mutex<[String: InstanceLock]>([:])

    /// Locks each of `directories` not yet held; exit 2 (one line, the holder's pid) when another
    /// process holds one.
    func acquire(directories: [String]) throws {
        for directory in Set(directories).sorted() where held.withLock({ $0[directory] == nil }) {
            do {
                keep(try InstanceLock.forDirectory(directory), for: directory)
            } catch {
                throw BroadcastError(.invalidArgument, error.description)
            }
        }
    }

    func keep(_ lock: InstanceLock, for key: String) {
        held.withLock { $0[key] = lock }
    }
}
