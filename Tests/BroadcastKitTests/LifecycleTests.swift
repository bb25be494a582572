import BroadcastKit
import Testing

@Suite struct LifecycleTests {
    typealias State = SessionLifecycle.State
    typealias Event = SessionLifecycle.Event

    static let legal: [State: [Event: State]] = [
        .idle: [.start: .started],
        .started: [.pause: .paused, .finish: .finished],
        .paused: [.resume: .started, .finish: .finished],
        .finished: [:],
    ]

    @Test(arguments: [State.idle, .started, .paused, .finished], Event.allCases)
    func everyTransition(from state: State, event: Event) {
        var machine = SessionLifecycle(state: state)
        if let expected = Self.legal[state]![event] {
            #expect(throws: Never.self) { try machine.apply(event) }
            #expect(machine.state == expected)
        } else {
            let error = #expect(throws: BroadcastError.self) { try machine.apply(event) }
            #expect(error?.code == .illegalTransition)
            #expect(error?.message.contains("cannot \(event)") == true)
            #expect(machine.state == state, "an illegal call changes nothing")
        }
    }
}
