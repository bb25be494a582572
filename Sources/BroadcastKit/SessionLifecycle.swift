/// The session's lifecycle as a pure state machine: idle → started ⇄ paused → finished.
///
/// What each transition means (the session does the work, this only decides):
/// - start (idle → started): the handler gets `broadcastStarted`, sources start, media time is 0.
/// - pause (started → paused): the handler gets `broadcastPaused`; buffers captured while paused are
///   dropped and the time spent paused is taken out of media time.
/// - resume (paused → started): the handler gets `broadcastResumed`; media time goes on where it stopped.
/// - finish (started or paused → finished): sources stop, the handler gets `broadcastFinished`. Final.
/// Any other call is an `illegalTransition` error and changes nothing.
public struct SessionLifecycle: Sendable, Hashable {
    public enum State: UInt8, Sendable, Hashable, CustomStringConvertible {
        case idle
        case started
        case paused
        case finished

        public var description: String {
            switch self {
            case .idle: "idle"
            case .started: "started"
            case .paused: "paused"
            case .finished: "finished"
            }
        }
    }

    public enum Event: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
        case start, pause, resume, finish
        public var description: String { rawValue }
    }

    public private(set) var state: State

    public init(state: State = .idle) { self.state = state }

    /// The state `event` leads to from `state`, or the error that says why it may not happen.
    public static func next(from state: State, on event: Event) -> Result<State, BroadcastError> {
        switch (state, event) {
        case (.idle, .start): return .success(.started)
        case (.started, .pause): return .success(.paused)
        case (.paused, .resume): return .success(.started)
        case (.started, .finish), (.paused, .finish): return .success(.finished)
        default:
            let why: String
            switch (state, event) {
            case (.idle, _): why = "the broadcast has not started"
            case (.finished, _): why = "the broadcast has finished"
            case (_, .start): why = "the broadcast has already started"
            case (.started, .resume): why = "the broadcast is not paused"
            case (.paused, .pause): why = "the broadcast is already paused"
            default: why = "not allowed"
            }
            return .failure(BroadcastError(.illegalTransition, "cannot \(event) while \(state): \(why)"))
        }
    }

    /// Applies `event`, or throws without changing anything.
    @discardableResult
    public mutating func apply(_ event: Event) throws(BroadcastError) -> State {
        switch Self.next(from: state, on: event) {
        case .success(let newState):
            state = newState
            return newState
        case .failure(let error):
            throw error
        }
    }
}
