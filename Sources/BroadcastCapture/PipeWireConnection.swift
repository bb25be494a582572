internal import CPipeWire
internal import CPipeWireShim

#if canImport(Glibc)
import Glibc
#endif

/// One connection to the PipeWire server with a loop of our own (not pw_thread_loop: the thread
/// that owns the connection runs the loop with `iterate`, so nothing needs a lock), the registry
/// and the "default" metadata mirrored into a `PipeWireAudioGraph`.
///
/// Owned by the thread that makes it, for its whole life: that thread has the loop entered from
/// `init` to `deinit` (`CBroadcastPW_loopEnter`), so what libpipewire's data thread hands to the
/// loop (stream `process` calls, state changes) waits for that thread's next `iterate` instead of
/// running at once on the data thread. Made, iterated and released on that one thread.
final class PipeWireConnection {
    let loop: UnsafeMutablePointer<pw_loop>
    let context: OpaquePointer
    let core: OpaquePointer
    private var registry: OpaquePointer?
    private var metadata: OpaquePointer?
    private let coreHook = UnsafeMutablePointer<spa_hook>.allocate(capacity: 1)
    private let registryHook = UnsafeMutablePointer<spa_hook>.allocate(capacity: 1)
    private let metadataHook = UnsafeMutablePointer<spa_hook>.allocate(capacity: 1)
    private let coreEvents = UnsafeMutablePointer<pw_core_events>.allocate(capacity: 1)
    private let registryEvents = UnsafeMutablePointer<pw_registry_events>.allocate(capacity: 1)
    private let metadataEvents = UnsafeMutablePointer<pw_metadata_events>.allocate(capacity: 1)

    /// The graph as the registry has told it so far.
    private(set) var graph = PipeWireAudioGraph()
    /// Bumped on every change of `graph`, so a user can tell whether to re-plan.
    private(set) var generation = 0
    /// Last `done` sequence number seen.
    private(set) var doneSequence: Int32 = -1
    /// Set when the server reported a fatal error on the core (it went away).
    private(set) var failure: String?

    /// Connects (to `remote`, a socket path, or else the session's server as PIPEWIRE_REMOTE and
    /// XDG_RUNTIME_DIR say); throws a readable reason when no PipeWire server answers.
    init(remote: String? = nil) throws(PipeWireError) {
        PipeWire.initialize()
        guard let loop = pw_loop_new(nil) else { throw PipeWireError("cannot create a PipeWire loop") }
        guard let context = pw_context_new(loop, nil, 0) else {
            pw_loop_destroy(loop)
            throw PipeWireError("cannot create a PipeWire context")
        }
        CBroadcastPW_loopEnter(loop, context)
        let properties = remote.flatMap { remote in
            "remote.name".withCString { key in remote.withCString { value in
                var keys: [UnsafePointer<CChar>?] = [key]
                var values: [UnsafePointer<CChar>?] = [value]
                return CBroadcastPW_properties(&keys, &values, 1)
            } }
        }
        guard let core = pw_context_connect(context, properties, 0) else {
            let reason = access(remote ?? Self.socketPath, F_OK) == 0 ? String(cString: strerror(errno)) : "no such socket"
            pw_context_destroy(context)
            CBroadcastPW_loopLeave(loop)
            pw_loop_destroy(loop)
            throw PipeWireError("no PipeWire server answers (\(remote ?? Self.socketPath)): \(reason)")
        }
        self.loop = loop
        self.context = context
        self.core = core
        for hook in [coreHook, registryHook, metadataHook] { hook.initialize(to: spa_hook()) }

        coreEvents.initialize(to: pw_core_events())
        coreEvents.pointee.version = UInt32(PW_VERSION_CORE_EVENTS)
        coreEvents.pointee.done = { data, id, seq in
            guard let data, id == UInt32(PW_ID_CORE) else { return }
            Unmanaged<PipeWireConnection>.fromOpaque(data).takeUnretainedValue().doneSequence = seq
        }
        coreEvents.pointee.error = { data, id, _, res, message in
            guard let data, id == UInt32(PW_ID_CORE) else { return }
            let connection = Unmanaged<PipeWireConnection>.fromOpaque(data).takeUnretainedValue()
            connection.failure = message.map { String(cString: $0) } ?? PipeWire.describe(res)
        }
        let me = Unmanaged.passUnretained(self).toOpaque()
        CBroadcastPWAudio_core_listen(core, coreHook, coreEvents, me)

        registryEvents.initialize(to: pw_registry_events())
        registryEvents.pointee.version = UInt32(PW_VERSION_REGISTRY_EVENTS)
        registryEvents.pointee.global = { data, id, _, type, _, props in
            guard let data, let type else { return }
            Unmanaged<PipeWireConnection>.fromOpaque(data).takeUnretainedValue().added(id: id, type: String(cString: type), props: props)
        }
        registryEvents.pointee.global_remove = { data, id in
            guard let data else { return }
            let connection = Unmanaged<PipeWireConnection>.fromOpaque(data).takeUnretainedValue()
            connection.graph.remove(id: id)
            connection.generation += 1
        }
        registry = CBroadcastPWAudio_registry(core, registryHook, registryEvents, me)

        metadataEvents.initialize(to: pw_metadata_events())
        metadataEvents.pointee.version = UInt32(PW_VERSION_METADATA_EVENTS)
        metadataEvents.pointee.property = { data, subject, key, _, value in
            guard let data, subject == 0 else { return 0 }
            let connection = Unmanaged<PipeWireConnection>.fromOpaque(data).takeUnretainedValue()
            let name = PipeWireAudioGraph.metadataName(value.map { String(cString: $0) })
            switch key.map({ String(cString: $0) }) {
            case "default.audio.sink": connection.graph.defaultSinkName = name
            case "default.audio.source": connection.graph.defaultSourceName = name
            case nil:  // every key cleared
                connection.graph.defaultSinkName = nil
                connection.graph.defaultSourceName = nil
            default: return 0
            }
            connection.generation += 1
            return 0
        }
    }

    deinit {
        if let metadata { pw_proxy_destroy(metadata) }
        if let registry { pw_proxy_destroy(registry) }
        pw_core_disconnect(core)
        pw_context_destroy(context)
        CBroadcastPW_loopLeave(loop)
        pw_loop_destroy(loop)
        for hook in [coreHook, registryHook, metadataHook] { hook.deallocate() }
        coreEvents.deallocate()
        registryEvents.deallocate()
        metadataEvents.deallocate()
    }

    static var socketPath: String {
        let name = getenv("PIPEWIRE_REMOTE").map { String(cString: $0) } ?? "pipewire-0"
        if name.hasPrefix("/") { return name }
        let runtime = getenv("PIPEWIRE_RUNTIME_DIR") ?? getenv("XDG_RUNTIME_DIR")
        return (runtime.map { String(cString: $0) } ?? "$XDG_RUNTIME_DIR") + "/" + name
    }

    private func added(id: UInt32, type: String, props: UnsafePointer<spa_dict>?) {
        func value(_ key: String) -> String? { CBroadcastPWAudio_lookup(props, key).map { String(cString: $0) } }
        switch type {
        case "PipeWire:Interface:Node":
            guard let mediaClass = value("media.class") else { return }
            graph.nodes[id] = PipeWireAudioGraph.Node(
                id: id, serial: value("object.serial") ?? "\(id)", name: value("node.name") ?? "",
                description: value("node.description") ?? value("media.name") ?? "", mediaClass: mediaClass,
                applicationName: value("application.name"), processBinary: value("application.process.binary")
            )
        case "PipeWire:Interface:Port":
            guard let node = value("node.id").flatMap(UInt32.init), let direction = value("port.direction") else { return }
            graph.ports[id] = PipeWireAudioGraph.Port(
                id: id, nodeID: node, isOutput: direction == "out", channel: value("audio.channel") ?? "",
                isMonitor: value("port.monitor") == "true"
            )
        case "PipeWire:Interface:Link":
            guard let output = value("link.output.port").flatMap(UInt32.init), let input = value("link.input.port").flatMap(UInt32.init) else { return }
            graph.portLinks[id] = PipeWireAudioGraph.PortPair(output: output, input: input)
        case "PipeWire:Interface:Metadata":
            guard value("metadata.name") == "default", metadata == nil, let registry else { return }
            metadata = CBroadcastPWAudio_bind_metadata(registry, id, metadataHook, metadataEvents, Unmanaged.passUnretained(self).toOpaque())
            return
        default:
            return
        }
        generation += 1
    }

    /// Runs the loop once (on the owning thread): waits up to `timeoutMilliseconds` for events and
    /// dispatches them, with what the data thread handed over since the last time.
    func iterate(timeoutMilliseconds: Int32) {
        CBroadcastPWAudio_loop_iterate(loop, timeoutMilliseconds)
    }

    /// Waits until the server has sent everything up to now (twice: the metadata bound in
    /// answer to the first round sends its properties in the second). False on timeout or failure.
    func roundTrip(timeoutNanoseconds: Int64) -> Bool {
        let deadline = MonotonicClockReading.now() + timeoutNanoseconds
        for round in 0..<2 {
            let sequence = CBroadcastPWAudio_core_sync(core, Int32(round))
            while doneSequence != sequence {
                if failure != nil || MonotonicClockReading.now() > deadline { return false }
                iterate(timeoutMilliseconds: 50)
            }
        }
        return true
    }
}

/// A failure of the PipeWire connection, as one readable line.
public struct PipeWireError: Error, CustomStringConvertible {
    public let text: String
    init(_ text: String) { self.text = text }
    public var description: String { text }
}

enum MonotonicClockReading {
    static func now() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }
}

extension PipeWireAudioGraph {
    /// The graph as the PipeWire server describes it now (for `broadcast devices` and for
    /// checking a target before capture starts). Throws when no server answers.
    public static func snapshot(timeoutNanoseconds: Int64 = 2_000_000_000) throws(PipeWireError) -> PipeWireAudioGraph {
        let connection = try PipeWireConnection()
        guard connection.roundTrip(timeoutNanoseconds: timeoutNanoseconds) else {
            throw PipeWireError("the PipeWire server at \(PipeWireConnection.socketPath) did not answer in time" + (connection.failure.map { ": \($0)" } ?? ""))
        }
        return connection.graph
    }

    /// Whether a PipeWire server answers on this session's socket (what `--audio-mic default`
    /// uses to choose PipeWire over ALSA's default PCM).
    public static var serverAnswers: Bool {
        guard access(PipeWireConnection.socketPath, F_OK) == 0 else { return false }
        return (try? PipeWireConnection())?.roundTrip(timeoutNanoseconds: 1_000_000_000) ?? false
    }
}
