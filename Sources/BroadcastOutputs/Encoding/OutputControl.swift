import Atomics

/// The handler's outputs as other threads see them, and the way to change the set while the
/// broadcast runs (the daemon's SIGHUP). Lock-free: the list is one atomic reference, replaced
/// whole by the session's thread; a request is the desired set, and the newest one wins.
public final class OutputControl: Sendable {
    final class List: AtomicReference, Sendable {
        let outputs: [Output]
        init(_ outputs: [Output]) { self.outputs = outputs }
    }
    /// A set of outputs asked for, and what became of each once the session's thread applied it.
    public final class Request: Sendable {
        public let desired: [OutputConfiguration]
        private let changes = ManagedAtomic<Answer?>(nil)
        final class Answer: AtomicReference, Sendable {
            let changes: [OutputChange]
            init(_ changes: [OutputChange]) { self.changes = changes }
        }
        init(_ desired: [OutputConfiguration]) { self.desired = desired }

        func answer(_ changes: [OutputChange]) { self.changes.store(Answer(changes), ordering: .releasing) }

        /// What happened to each output; nil until the session's thread applied the set (a newer
        /// request taken first means this one never is).
        public var result: [OutputChange]? { changes.load(ordering: .acquiring)?.changes }
    }
    final class Asked: AtomicReference, Sendable {
        let request: Request
        init(_ request: Request) { self.request = request }
    }

    private let list: ManagedAtomic<List>
    private let request = ManagedAtomic<Asked?>(nil)

    init(_ outputs: [Output]) { list = ManagedAtomic(List(outputs)) }

    public var outputs: [Output] { list.load(ordering: .acquiring).outputs }

    /// Asks for exactly these outputs; applied before the next buffer the handler gets, or at
    /// once when the session is asked for a turn (`BroadcastSession.requestControl()`). The
    /// request's `result` says what became of each output.
    @discardableResult
    public func reconfigure(_ desired: [OutputConfiguration]) -> Request {
        let request = Request(desired)
        self.request.store(Asked(request), ordering: .releasing)
        return request
    }

    func takeRequest() -> Request? {
        guard request.load(ordering: .relaxed) != nil else { return nil }
        return request.exchange(nil, ordering: .acquiringAndReleasing)?.request
    }

    func publish(_ outputs: [Output]) { list.store(List(outputs), ordering: .releasing) }
}

/// What a change of the output set did to one output.
public struct OutputChange: Sendable, Hashable {
    public enum Result: String, Sendable, Hashable {
        /// Its configuration did not change: it goes on untouched.
        case unchanged
        /// New: it started.
        case added
        /// Its configuration changed: the old one ended and the new one started.
        case replaced
        /// Left out of the set: it ended.
        case removed
        /// Its new configuration could not start: it goes on with the old one (`reason` says why).
        case kept
        /// New, and it could not start (`reason` says why).
        case failed
    }

    public var name: String
    public var result: Result
    public var reason: String?

    public init(name: String, result: Result, reason: String? = nil) {
        self.name = name
        self.result = result
        self.reason = reason
    }
}
