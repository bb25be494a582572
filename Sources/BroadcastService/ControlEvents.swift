import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One change of the daemon's state, as `GET /v1/events` sends it (server-sent events):
/// `id: 12`, `event: output`, `data: {"time":"...","name":"live","state":"reconnecting"}`.
public struct ControlEvent: Sendable {
    /// Increasing from 1, without gaps, for the daemon's lifetime.
    public let id: UInt64
    /// `broadcast`, `output`, `device`, `file`; `state` for the snapshot a client gets first.
    public let type: String
    /// RFC 3339 UTC, milliseconds.
    public let time: String
    /// The event's fields (without `time`, which `encoded` adds first).
    public let fields: [(String, JSONValue)]

    public init(id: UInt64, type: String, time: String, fields: [(String, JSONValue)]) {
        self.id = id
        self.type = type
        self.time = time
        self.fields = fields
    }

    /// The event as an SSE message, ending with its blank line; without an `id:` line when the id
    /// is 0 (a transient event, which a client's Last-Event-ID does not count).
    public var encoded: [UInt8] {
        let data = JSONValue.object([("time", .string(time))] + fields).serialized()
        return Array("\(id == 0 ? "" : "id: \(id)\n")event: \(type)\ndata: \(data)\n\n".utf8)
    }
}

/// The daemon's events: a bounded history (for `Last-Event-ID`) and one bounded queue per client.
///
/// `publish` never waits for a client: it appends to each client's queue, and a client whose queue
/// is full is marked as dropped (its stream ends with a `dropped` event and the server closes the
/// connection), so a client that does not read costs at most `clientQueueLimit` events of memory.
/// Publishers hold the lock only to append; nothing on the data path publishes (the daemon's
/// watcher reads the broadcast's atomics and publishes the differences).
public final class ControlEvents: Sendable {
    public let historyLimit: Int
    public let clientQueueLimit: Int

    private struct Client {
        var queue: [ControlEvent] = []
        var dropped = false
        var waiter: CheckedContinuation<Next, Never>?
        var onDrop: (@Sendable () -> Void)?
        /// Asked for the transient events too (`/v1/events?levels=1`).
        var transient = false
    }

    private struct State {
        var lastID: UInt64 = 0
        var history: [ControlEvent] = []
        var clients: [Int: Client] = [:]
        var nextClient = 0
        var finished = false
    }

    /// What a client's stream gets next.
    public enum Next: Sendable {
        case event(ControlEvent)
        /// The client fell behind by more than `clientQueueLimit` events and was dropped.
        case dropped
        /// The daemon is shutting down.
        case finished
    }

    private let state = Mutex(State())
    private let clock: @Sendable () -> String

    public init(historyLimit: Int = 1024, clientQueueLimit: Int = 256, clock: @escaping @Sendable () -> String = ControlEvents.now) {
        precondition(historyLimit > 0 && clientQueueLimit > 0)
        self.historyLimit = historyLimit
        self.clientQueueLimit = clientQueueLimit
        self.clock = clock
    }

    /// The id of the last event published (0: none yet).
    public var lastID: UInt64 { state.withLock { $0.lastID } }

    /// Clients currently subscribed.
    public var clientCount: Int { state.withLock { $0.clients.count } }

    /// Clients that asked for the transient events.
    public var transientClientCount: Int { state.withLock { $0.clients.values.filter(\.transient).count } }

    /// Publishes one event to the history and every client; returns its id.
    @discardableResult
    public func publish(_ type: String, _ fields: [(String, JSONValue)]) -> UInt64 {
        let time = clock()
        var wake: [(CheckedContinuation<Next, Never>, Next)] = []
        var dropped: [@Sendable () -> Void] = []
        let id = state.withLock { state -> UInt64 in
            state.lastID += 1
            let event = ControlEvent(id: state.lastID, type: type, time: time, fields: fields)
            state.history.append(event)
            if state.history.count > historyLimit { state.history.removeFirst(state.history.count - historyLimit) }
            for key in Array(state.clients.keys) {
                guard var client = state.clients[key], !client.dropped else { continue }
                if let waiter = client.waiter {
                    client.waiter = nil
                    wake.append((waiter, .event(event)))
                } else if client.queue.count >= clientQueueLimit {
                    client.dropped = true
                    client.queue = []
                    if let onDrop = client.onDrop { dropped.append(onDrop) }
                } else {
                    client.queue.append(event)
                }
                state.clients[key] = client
            }
            return state.lastID
        }
        for (waiter, next) in wake { waiter.resume(returning: next) }
        for onDrop in dropped { onDrop() }
        return id
    }

    /// Sends an event to the clients following now that asked for transient events, without an id
    /// and without keeping it in the history: the audio meters' `levels`, ten a second, would push
    /// every other event out of it (and a client resuming after a gap has no use for old levels).
    /// A client with half its queue waiting misses it rather than being dropped for it.
    public func publishTransient(_ type: String, _ fields: [(String, JSONValue)]) {
        let event = ControlEvent(id: 0, type: type, time: clock(), fields: fields)
        let wake = state.withLock { state -> [CheckedContinuation<Next, Never>] in
            var wake: [CheckedContinuation<Next, Never>] = []
            for key in Array(state.clients.keys) {
                guard var client = state.clients[key], !client.dropped, client.transient else { continue }
                if let waiter = client.waiter {
                    client.waiter = nil
                    wake.append(waiter)
                } else if client.queue.count < clientQueueLimit / 2 {
                    client.queue.append(event)
                }
                state.clients[key] = client
            }
            return wake
        }
        for waiter in wake { waiter.resume(returning: .event(event)) }
    }

    /// A client's place in the events.
    public struct Subscription: Sendable {
        public let key: Int
        /// The id the client is up to: events after it come through `next`.
        public let after: UInt64
        /// False when `Last-Event-ID` was older than the history: the client missed events and
        /// gets the current state instead.
        public let resumed: Bool
    }

    /// Subscribes a client. With `lastEventID` still in the history, the events after it are queued
    /// first (a resume without loss); otherwise the client starts from now (and is sent the state).
    /// `onDrop` is called (once, by the publisher) when the client falls too far behind.
    public func subscribe(lastEventID: UInt64?, onDrop: (@Sendable () -> Void)? = nil) -> Subscription {
        subscribe(lastEventID: lastEventID, atMost: .max, onDrop: onDrop)!
    }

    /// `subscribe`, or nil when `limit` clients are subscribed already: the count is checked and
    /// the client added under one lock, so a burst of connections cannot pass the limit together
    /// (checked apart, 96 of 100 at once got through a limit of 64).
    /// `transient`: the client gets the transient events too (`publishTransient`).
    public func subscribe(
        lastEventID: UInt64?, atMost limit: Int, transient: Bool = false, onDrop: (@Sendable () -> Void)? = nil
    ) -> Subscription? {
        state.withLock { state in
            guard state.clients.count < limit else { return nil }
            let key = state.nextClient
            state.nextClient += 1
            var client = Client()
            client.onDrop = onDrop
            client.transient = transient
            var resumed = false
            if let lastEventID, lastEventID <= state.lastID,
                lastEventID + 1 >= (state.history.first?.id ?? state.lastID + 1)
            {
                client.queue = state.history.filter { $0.id > lastEventID }
                resumed = true
            }
            state.clients[key] = client
            return Subscription(key: key, after: resumed ? lastEventID! : state.lastID, resumed: resumed)
        }
    }

    /// The next event for a client, waiting for one.
    public func next(_ subscription: Subscription) async -> Next {
        await withCheckedContinuation { (continuation: CheckedContinuation<Next, Never>) in
            let now: Next? = state.withLock { state in
                guard var client = state.clients[subscription.key] else { return .finished }
                if client.dropped { return .dropped }
                if !client.queue.isEmpty {
                    let event = client.queue.removeFirst()
                    state.clients[subscription.key] = client
                    return .event(event)
                }
                if state.finished { return .finished }
                client.waiter = continuation
                state.clients[subscription.key] = client
                return nil
            }
            if let now { continuation.resume(returning: now) }
        }
    }

    /// Ends a client's subscription (it disconnected); a waiting `next` returns `.finished`.
    public func unsubscribe(_ subscription: Subscription) {
        let waiter = state.withLock { $0.clients.removeValue(forKey: subscription.key)?.waiter }
        waiter?.resume(returning: .finished)
    }

    /// Events queued for a client and not yet taken (for tests and the status).
    public func queued(_ subscription: Subscription) -> Int? {
        state.withLock { $0.clients[subscription.key].map { $0.dropped ? -1 : $0.queue.count } }
    }

    /// Ends every stream once its queue is drained (the daemon is shutting down).
    public func finish() {
        let waiters = state.withLock { state -> [CheckedContinuation<Next, Never>] in
            state.finished = true
            var waiters: [CheckedContinuation<Next, Never>] = []
            for key in Array(state.clients.keys) {
                if let waiter = state.clients[key]?.waiter {
                    waiters.append(waiter)
                    state.clients[key]?.waiter = nil
                }
            }
            return waiters
        }
        for waiter in waiters { waiter.resume(returning: .finished) }
    }

    /// Now as RFC 3339 UTC with milliseconds: "2026-11-25T09:50:00.123Z".
    @Sendable public static func now() -> String {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        var seconds = spec.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        let millis = Int(spec.tv_nsec / 1_000_000)
        let ms = millis < 10 ? "00\(millis)" : millis < 100 ? "0\(millis)" : "\(millis)"
        return "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday))T"
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)).\(ms)Z"
    }
}
