import BroadcastKit
import BroadcastMedia
import Logging

/// What a live output's thread says about its connection, in the output's status and in the log:
/// the state machine's state, the packets it dropped, and what a lost connection means.
///
/// The RTMP/SRT worker (`LiveStreamWorker`) and the WHIP worker (`WHIPWorker`) each own one, so a
/// reconnect, a refusal and a give-up read the same whichever protocol carries the stream. The
/// decisions stay the state machine's; this only tells them.
struct LiveStreamReport {
    typealias LossAction = LiveStreamStateMachine<EncodedPacket>.LossAction

    let output: Output
    let url: StreamURL
    let logger: Logger

    var status: OutputStatus { output.status }

    /// Shows the state machine's state in the status. A failure is `Output.failed`'s to report, and
    /// the end is the worker's.
    func publish(_ state: OutputState) {
        if state != .failed, state != .finished, status.current != state { status.set(state) }
    }

    func drop(_ reason: DropReason, _ count: Int = 1) { if count > 0 { status.drop(reason, count: count) } }

    func count(_ drops: Drops) {
        guard !drops.isEmpty else { return }
        for reason in DropReason.allCases { drop(reason, drops[reason]) }
    }

    /// Reports what the state machine decided after a connect failed or a live connection was lost.
    ///
    /// - Parameters:
    ///   - message: the error, already scrubbed of the URL's secrets.
    ///   - failures: the machine's failures in a row (the status's attempt number).
    ///   - state: the machine's state after the decision.
    ///   - sending: the connection was live (a loss), not being opened (a connect failure).
    ///   - refusal: what a refusal `times` in a row is, in words ("the server refused the stream 3 times in a row").
    func lost(
        _ action: LossAction, message: String, failures: Int, state: OutputState, sending: Bool, refusal: (_ times: Int) -> String
    ) {
        status.bitrate.store(0, ordering: .relaxed)
        status.setBacklog(0)
        switch action {
        case .reconnect(_, _, _, _, let dropped), .fail(_, _, _, let dropped):
            drop(.offline, dropped)
        }
        status.setError(message)
        status.attempt.store(failures, ordering: .relaxed)
        switch action {
        case .fail(.refused(let times), _, _, _):
            output.failed("stream \(url.redacted): \(refusal(times)); giving up. Last error: \(message)")
        case .fail(.gaveUp(let attempts), _, _, _):
            output.failed("stream \(url.redacted): gave up after \(attempts) failed attempts. Last error: \(message)")
        case .reconnect(let delay, let attempt, _, _, _):
            publish(state)
            let what = sending ? "connection lost" : "could not connect"
            logger.warning(
                "stream \(url.redacted): \(what): \(message); reconnecting in \(Self.seconds(delay.inSeconds)) (attempt \(attempt))")
        }
    }

    /// A duration for people: "2.5 s".
    static func seconds(_ value: Double) -> String {
        let tenths = Int((value * 10).rounded())
        return "\(tenths / 10).\(tenths % 10) s"
    }
}
