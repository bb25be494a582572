import Atomics
import BroadcastMedia

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A reading of CLOCK_MONOTONIC, typed: what the live output's deadlines, FFmpeg's interrupt
/// callback and `Output.finishBy` are measured on. Tests make their own and move them by hand.
struct MonotonicInstant: InstantProtocol, Sendable, Hashable, Comparable, CustomStringConvertible {
    /// Time since the clock's origin (boot, for CLOCK_MONOTONIC).
    var sinceOrigin: Duration

    init(sinceOrigin: Duration) { self.sinceOrigin = sinceOrigin }

    /// From `MonotonicClock.now()`'s nanoseconds.
    init(nanoseconds: Int64) { self.sinceOrigin = .nanoseconds(nanoseconds) }

    static func now() -> MonotonicInstant {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return MonotonicInstant(sinceOrigin: .seconds(Int64(ts.tv_sec)) + .nanoseconds(Int64(ts.tv_nsec)))
    }

    /// Nanoseconds since the clock's origin (what `MonotonicClock.now()` gives).
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = sinceOrigin.components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    func advanced(by duration: Duration) -> MonotonicInstant { MonotonicInstant(sinceOrigin: sinceOrigin + duration) }
    func duration(to other: MonotonicInstant) -> Duration { other.sinceOrigin - sinceOrigin }
    static func < (a: MonotonicInstant, b: MonotonicInstant) -> Bool { a.sinceOrigin < b.sinceOrigin }
    var description: String { "\(sinceOrigin)" }
}

/// A deadline one thread sets and another reads, lock-free: `MonotonicInstant?` at the API, its
/// nanoseconds in one atomic inside (a `Duration` is 128 bits, which no atomic here holds; the
/// clock's nanoseconds since boot are never 0, which stands for "not set").
final class FinishDeadline: Sendable {
    private let nanoseconds = ManagedAtomic<Int64>(0)

    /// The deadline, nil until set.
    var instant: MonotonicInstant? {
        let value = nanoseconds.load(ordering: .relaxed)
        return value == 0 ? nil : MonotonicInstant(nanoseconds: value)
    }

    func set(_ instant: MonotonicInstant) {
        nanoseconds.store(max(1, instant.nanoseconds), ordering: .relaxed)
    }
}

/// Packets not sent, counted by reason: what one event of the live output dropped.
struct Drops: Hashable, CustomStringConvertible {
    private(set) var backlog = 0
    private(set) var backlogReference = 0
    private(set) var awaitingKeyframe = 0
    private(set) var offline = 0
    private(set) var queueFull = 0
    private(set) var paused = 0
    private(set) var writeFailed = 0

    static let none = Drops()

    init() {}

    init(_ reason: DropReason, _ count: Int) { add(reason, count) }

    subscript(reason: DropReason) -> Int {
        get {
            switch reason {
            case .backlog: backlog
            case .backlogReference: backlogReference
            case .awaitingKeyframe: awaitingKeyframe
            case .offline: offline
            case .queueFull: queueFull
            case .paused: paused
            case .writeFailed: writeFailed
            }
        }
        set {
            switch reason {
            case .backlog: backlog = newValue
            case .backlogReference: backlogReference = newValue
            case .awaitingKeyframe: awaitingKeyframe = newValue
            case .offline: offline = newValue
            case .queueFull: queueFull = newValue
            case .paused: paused = newValue
            case .writeFailed: writeFailed = newValue
            }
        }
    }

    mutating func add(_ reason: DropReason, _ count: Int = 1) { self[reason] += count }

    mutating func add(_ other: Drops) {
        for reason in DropReason.allCases { self[reason] += other[reason] }
    }

    var total: Int { backlog + backlogReference + awaitingKeyframe + offline + queueFull + paused + writeFailed }
    var isEmpty: Bool { total == 0 }

    var description: String {
        let parts = DropReason.allCases.compactMap { self[$0] > 0 ? "\($0)=\(self[$0])" : nil }
        return parts.isEmpty ? "none" : parts.joined(separator: " ")
    }
}

/// A live output as a pure state machine: it decides, the output's thread does (connects, writes,
/// waits, closes with libavformat) and tells it what happened. No clock of its own: every event
/// that depends on time is given the time; no I/O, no atomics, no logging.
///
/// ```
///            ┌──────────── connectFailed / writeFailed (reconnect after backoff) ───────────┐
///            ▼                                                                              │
///  waiting(until) ──connect──▶ connecting ──connected──▶ connected ──send──▶ writing(since) ─┤
///            ▲                                              ▲               │  (stalled      │
///            │                                              └───written─────┘   after 1 s)   │
///            └─────────────────────────── (refused 3× / max attempts) ──▶ failed ◀───────────┘
///  any state ── finish requested, and: nothing to send, not connected, or the deadline passed ──▶ finished
/// ```
///
/// Orthogonal to the connection: `paused` (everything is dropped, no connect attempt), the
/// `SendQueue` and its drop policy, and "restart pending" (drop until a keyframe to start from).
struct LiveStreamStateMachine<Packet: LivePacket> {
    enum State: Hashable {
        /// Not connected; the next attempt is due at `until`.
        case waiting(until: MonotonicInstant)
        /// A connect (and the header write) is under way.
        case connecting
        /// Connected at `since`, nothing being written.
        case connected(since: MonotonicInstant)
        /// A packet's write began at `writeStarted` and has not returned; `stalled` once it blocked
        /// for `stallAfter`.
        case writing(connectedSince: MonotonicInstant, writeStarted: MonotonicInstant, dts: Int64, stalled: Bool)
        /// Gave up (the server refused, or too many attempts). Final.
        case failed
        /// Done (sent what it could, closed). Final.
        case finished
    }

    /// What the output's thread does next (the answer to a clock tick).
    enum Action {
        /// Open the connection and write the header; a call that passes `deadline` is interrupted.
        case connect(deadline: MonotonicInstant)
        /// Write `packet`; a write that passes `deadline` is interrupted (the connection is lost).
        case send(Packet, deadline: MonotonicInstant)
        /// Nothing to do: sleep until packets come, the output is woken, or `until` (nil: no time
        /// of its own to wake at).
        case wait(until: MonotonicInstant?)
        /// Stop: close the connection if one is open (the trailer may take until `closeDeadline`),
        /// count `dropped` packets as offline, and report the end. Final.
        case finish(closeConnection: Bool, closeDeadline: MonotonicInstant, dropped: Int)
        /// The output has failed: stop. Final.
        case stop
    }

    /// What follows a connection that could not be opened or broke.
    enum LossAction: Equatable {
        /// Close what is left of the connection (give it until `closeDeadline`), count `dropped`
        /// as offline, and try again after `delay`; `attempt` is the next attempt's number.
        case reconnect(after: Duration, attempt: Int, closeDeadline: MonotonicInstant, timedOut: Bool, dropped: Int)
        /// Give up: the output has failed.
        case fail(Failure, closeDeadline: MonotonicInstant, timedOut: Bool, dropped: Int)
    }

    enum Failure: Equatable {
        /// The server refused the publish (or dropped it at once) this many times in a row.
        case refused(times: Int)
        /// This many connection attempts in a row failed (`ReconnectPolicy.maxAttempts`).
        case gaveUp(attempts: Int)
    }

    /// What a connection that just opened needs.
    struct ConnectedAction: Equatable {
        /// It follows an earlier connection that delivered: count a reconnect.
        var isReconnect: Bool
        /// The queue did not start with a recent keyframe: it was emptied (`dropped` packets), the
        /// stream waits for a keyframe, and the encoder must be asked for one now.
        var requestKeyframe: Bool
        var dropped: Int
    }

    /// What FFmpeg's interrupt callback does (it runs on the output's thread, about every 100 ms,
    /// while a connect, write or close blocks).
    enum BlockedAction: Equatable {
        /// Go on waiting.
        case carryOn
        /// A write has blocked `intakeWhileBlocked` or longer: take the encoder's packets into the
        /// send queue (where the drop policy sees them) and report the backlog.
        case takePackets
        /// As `takePackets`, and the write has just been blocked `stallAfter`: the output is stalled.
        case takePacketsStalled(blockedFor: Duration)
        /// End the call: its deadline, or the broadcast's finish deadline, passed.
        case interrupt
    }

    // MARK: Configuration

    let settings: LiveStreamSettings
    let hasVideo: Bool
    /// A random number in 0..<1 for the reconnect delay's jitter.
    let jitter: () -> Double
    /// A write blocked this long means the server takes nothing: the output is stalled.
    static var stallAfter: Duration { .seconds(1) }
    /// While a write blocks longer than this, packets keep coming off the encoder's queue into the
    /// send queue, where the backlog policy drops them.
    static var intakeWhileBlocked: Duration { .milliseconds(100) }
    /// A publish the server drops sooner than this after it was accepted counts as refused.
    static var refusedWithin: Duration { .seconds(3) }
    /// How long the rest of a lost connection may take to close.
    static var lostCloseTimeout: Duration { .seconds(1) }
    /// How long the trailer and close may take when the output finishes.
    static var finishCloseTimeout: Duration { .seconds(2) }
    var timeout: Duration { .seconds(settings.timeout) }

    // MARK: State

    private(set) var state: State
    /// Packets taken from the encoder, waiting to be sent, thinned by backlog.
    private(set) var queue: SendQueue<Packet>
    /// Waiting for a keyframe to (re)start from: everything before it is dropped.
    private(set) var restartPending = true
    private(set) var isPaused = false
    /// Failed connection attempts in a row.
    private(set) var failures = 0
    /// Refused publishes in a row.
    private(set) var refusals = 0
    /// A connection was open at least once.
    private(set) var everConnected = false
    /// When the broadcast finishes: send what is queued until then. nil: not finishing.
    private(set) var finishDeadline: MonotonicInstant?
    /// The deadline of the blocking call under way (connect, write, close), nil: none.
    private(set) var operationDeadline: MonotonicInstant?
    /// The interrupt callback ended the call under way because its deadline passed.
    private var timedOut = false

    init(settings: LiveStreamSettings, hasVideo: Bool, now: MonotonicInstant, jitter: @escaping () -> Double = { Double.random(in: 0..<1) }) {
        self.settings = settings
        self.hasVideo = hasVideo
        self.jitter = jitter
        self.state = .waiting(until: now)
        self.queue = SendQueue(threshold: settings.dropThreshold, referenceThreshold: settings.referenceDropThreshold)
    }

    var isConnected: Bool {
        switch state {
        case .connected, .writing: true
        default: false
        }
    }

    /// What the output reports.
    var outputState: OutputState {
        switch state {
        case .failed: return .failed
        case .finished: return .finished
        case _ where isPaused: return .paused
        case .waiting, .connecting: return everConnected || failures > 0 ? .reconnecting : .connecting
        case .connected: return .live
        case .writing(_, _, _, let stalled): return stalled ? .stalled : .live
        }
    }

    /// dts (ns) of the packet being written (the oldest media the socket has not taken), if any.
    var writingDTS: Int64? {
        if case .writing(_, _, let dts, _) = state { return dts }
        return nil
    }

    private var isFinal: Bool { state == .failed || state == .finished }

    /// The packet a (re)started stream may begin with.
    private func isStart(_ packet: Packet) -> Bool {
        packet.isKeyframe && (packet.mediaType == .video || !hasVideo)
    }

    // MARK: Events

    /// A packet came from the encoder: queued, or dropped (and maybe queued ones with it).
    mutating func packet(_ packet: Packet) -> Drops {
        var drops = Drops()
        if isFinal {
            drops.add(.offline)
        } else if isPaused {
            drops.add(.paused)
            restartPending = true
        } else if restartPending {
            if isStart(packet) {
                drops.add(.offline, queue.removeAll())
                restartPending = false
                queue.append(packet)
            } else {
                drops.add(.offline)
            }
        } else if !isConnected {
            queue.append(packet)
        } else {
            queue.add(packet) { drops.add($0) }
        }
        return drops
    }

    /// The encoder's queue overflowed (packets were lost before they got here): restart on a keyframe.
    mutating func feedOverflowed() { restartPending = true }

    /// The output was paused or resumed. While paused everything is dropped, no connection is
    /// attempted (an open one stays), and the stream restarts on a keyframe after.
    mutating func paused(_ paused: Bool) -> Drops {
        isPaused = paused
        guard paused else { return .none }
        restartPending = true
        return Drops(.paused, queue.removeAll())
    }

    /// The broadcast is finishing: what is queued may be sent until `deadline`.
    mutating func finishRequested(by deadline: MonotonicInstant) {
        if finishDeadline == nil { finishDeadline = deadline }
    }

    /// The clock ticked (a loop turn): what to do now.
    mutating func nextAction(now: MonotonicInstant) -> Action {
        switch state {
        case .failed, .finished:
            return .stop
        case .connecting, .writing:
            preconditionFailure("nextAction while a call is under way (\(state))")
        case .waiting(let until):
            if finishDeadline != nil { return finish(now: now) }
            if isPaused { return .wait(until: nil) }
            if now < until { return .wait(until: until) }
            state = .connecting
            timedOut = false
            let deadline = now + timeout
            operationDeadline = deadline
            return .connect(deadline: deadline)
        case .connected(let since):
            if let finishDeadline, queue.isEmpty || now > finishDeadline { return finish(now: now) }
            guard let packet = queue.popFirst() else { return .wait(until: nil) }
            state = .writing(connectedSince: since, writeStarted: now, dts: packet.dtsNanoseconds, stalled: false)
            timedOut = false
            let deadline = now + timeout
            operationDeadline = deadline
            return .send(packet, deadline: deadline)
        }
    }

    private mutating func finish(now: MonotonicInstant) -> Action {
        let close = isConnected
        state = .finished
        let deadline = now + Self.finishCloseTimeout
        operationDeadline = close ? deadline : nil
        return .finish(closeConnection: close, closeDeadline: deadline, dropped: queue.removeAll())
    }

    /// The connection is open and its header written.
    mutating func connected(now: MonotonicInstant) -> ConnectedAction {
        precondition(state == .connecting, "connected while \(state)")
        operationDeadline = nil
        let isReconnect = everConnected
        everConnected = true
        failures = 0
        state = .connected(since: now)
        // Start from what is queued if it begins with a keyframe recent enough; otherwise from a
        // fresh keyframe, asked of the encoder now.
        var dropped = 0
        let stale = restartPending || queue.first.map { !isStart($0) } ?? true || queue.backlog > queue.threshold
        if stale {
            dropped = queue.removeAll()
            restartPending = true
        }
        return ConnectedAction(isReconnect: isReconnect, requestKeyframe: stale, dropped: dropped)
    }

    /// The connect failed. `isNetworkFailure`: the network or server is not there (connection
    /// refused, unreachable, timed out), which is retried without counting as a refusal.
    mutating func connectFailed(isNetworkFailure: Bool, now: MonotonicInstant) -> LossAction {
        precondition(state == .connecting, "connectFailed while \(state)")
        return connectionLost(sending: false, refused: true, isNetworkFailure: isNetworkFailure, now: now)
    }

    /// The packet was written.
    /// Returns true when the write ended a stall (the server takes data again).
    mutating func written(now: MonotonicInstant) -> Bool {
        guard case .writing(let since, _, _, let stalled) = state else {
            preconditionFailure("written while \(state)")
        }
        operationDeadline = nil
        state = .connected(since: since)
        return stalled
    }

    /// The write failed (the connection broke, or the write timed out).
    mutating func writeFailed(isNetworkFailure: Bool, now: MonotonicInstant) -> LossAction {
        guard case .writing(let since, _, _, _) = state else { preconditionFailure("writeFailed while \(state)") }
        // A publish the server drops at once (nginx-rtmp's deny, a rejected key) counts as refused.
        let refused = since.duration(to: now) < Self.refusedWithin
        return connectionLost(sending: true, refused: refused, isNetworkFailure: isNetworkFailure, now: now)
    }

    private mutating func connectionLost(sending: Bool, refused: Bool, isNetworkFailure: Bool, now: MonotonicInstant) -> LossAction {
        let timedOut = self.timedOut
        self.timedOut = false
        let closeDeadline = now + Self.lostCloseTimeout
        operationDeadline = closeDeadline
        if isNetworkFailure || !refused {
            refusals = 0
        } else {
            refusals += 1
        }
        if sending { failures = 0 } else { failures += 1 }
        let dropped = queue.removeAll()
        restartPending = true
        if refusals >= settings.reconnect.maxRefusals {
            state = .failed
            return .fail(.refused(times: refusals), closeDeadline: closeDeadline, timedOut: timedOut, dropped: dropped)
        }
        if let max = settings.reconnect.maxAttempts, failures >= max {
            state = .failed
            return .fail(.gaveUp(attempts: failures), closeDeadline: closeDeadline, timedOut: timedOut, dropped: dropped)
        }
        let delay = Duration.seconds(settings.reconnect.delay(afterFailures: failures, unit: jitter()))
        state = .waiting(until: now + delay)
        return .reconnect(after: delay, attempt: failures + 1, closeDeadline: closeDeadline, timedOut: timedOut, dropped: dropped)
    }

    /// What was left of a connection (lost, or finished) is closed.
    mutating func closed() { operationDeadline = nil }

    /// FFmpeg's interrupt callback, polled while a call blocks: the write stalled or timed out,
    /// or the finish deadline passed.
    mutating func blocked(now: MonotonicInstant) -> BlockedAction {
        if let finishDeadline, now > finishDeadline { return .interrupt }
        if let operationDeadline, now > operationDeadline {
            timedOut = true
            return .interrupt
        }
        guard case .writing(let since, let started, let dts, let stalled) = state else { return .carryOn }
        let blocked = started.duration(to: now)
        guard blocked >= Self.intakeWhileBlocked else { return .carryOn }
        if blocked >= Self.stallAfter, !stalled, !isPaused {
            state = .writing(connectedSince: since, writeStarted: started, dts: dts, stalled: true)
            return .takePacketsStalled(blockedFor: blocked)
        }
        return .takePackets
    }
}

extension LiveStreamStateMachine.Action: Equatable where Packet: Equatable {}

extension MonotonicInstant {
    static func + (a: MonotonicInstant, b: Duration) -> MonotonicInstant { a.advanced(by: b) }
    static func - (a: MonotonicInstant, b: Duration) -> MonotonicInstant { a.advanced(by: .zero - b) }
}

extension Duration {
    /// In seconds, for messages.
    var inSeconds: Double {
        let (s, attoseconds) = components
        return Double(s) + Double(attoseconds) / 1e18
    }
}
