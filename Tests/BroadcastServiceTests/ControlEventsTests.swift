import BroadcastService
import Foundation
import Logging
import Testing

@Suite struct ControlEventsTests {
    static func ids(_ events: ControlEvents, _ subscription: ControlEvents.Subscription, count: Int) async -> [UInt64] {
        var ids: [UInt64] = []
        for _ in 0..<count {
            guard case .event(let event) = await events.next(subscription) else { break }
            ids.append(event.id)
        }
        return ids
    }

    /// Transient events (the page's `levels`) reach only the clients that asked for them, have no id
    /// and are not kept: a client resuming from the history does not get them.
    @Test func transientEventsReachOnlyTheClientsAskingAndAreNotKept() async {
        let events = ControlEvents()
        let plain = events.subscribe(lastEventID: nil)
        let page = events.subscribe(lastEventID: nil, atMost: 10, transient: true)!
        #expect(events.transientClientCount == 1)
        events.publishTransient("levels", [("meters", .array([]))])
        events.publish("output", [("name", .string("rec"))])
        guard case .event(let first) = await events.next(page), case .event(let second) = await events.next(page) else {
            Issue.record("the page client got no events")
            return
        }
        #expect(first.type == "levels" && first.id == 0 && !String(decoding: first.encoded, as: UTF8.self).contains("id:"))
        #expect(second.type == "output" && second.id == 1)
        guard case .event(let only) = await events.next(plain) else {
            Issue.record("the plain client got nothing")
            return
        }
        #expect(only.type == "output" && events.queued(plain) == 0)
        #expect(events.lastID == 1)
        let resumed = events.subscribe(lastEventID: 0, atMost: 10, transient: true)!
        #expect(events.queued(resumed) == 1, "only the output event is in the history")
    }

    /// Ids increase by one; a subscriber gets every event published after it subscribed, in order.
    @Test func subscribersGetEveryEventInOrder() async {
        let events = ControlEvents()
        events.publish("broadcast", [("state", .string("started"))])
        let subscription = events.subscribe(lastEventID: nil)
        #expect(!subscription.resumed && subscription.after == 1)
        for i in 0..<50 { events.publish("output", [("n", .number(Double(i)))]) }
        #expect(await Self.ids(events, subscription, count: 50) == Array(2...51))
    }

    /// `Last-Event-ID` in the history: exactly the events after it; older than the history: a
    /// fresh start (the client is sent the state instead).
    @Test func lastEventIDResumesFromTheHistory() async {
        let events = ControlEvents(historyLimit: 10)
        for _ in 0..<25 { events.publish("output", []) }
        let resumed = events.subscribe(lastEventID: 20)
        #expect(resumed.resumed && resumed.after == 20)
        #expect(events.queued(resumed) == 5)
        #expect(await Self.ids(events, resumed, count: 5) == [21, 22, 23, 24, 25])
        // Id 15 is the oldest kept (16...25 are): resuming after 15 loses nothing.
        #expect(events.subscribe(lastEventID: 15).resumed)
        let tooOld = events.subscribe(lastEventID: 14)
        #expect(!tooOld.resumed && tooOld.after == 25)
        #expect(events.queued(tooOld) == 0)
        // An id from the future (another daemon's) is a fresh start too.
        #expect(!events.subscribe(lastEventID: 99).resumed)
    }

    /// A client that does not take its events is dropped once `clientQueueLimit` are waiting;
    /// publishing never waits for it, and the others get everything.
    @Test func aClientThatFallsBehindIsDroppedAndOthersAreNot() async {
        let events = ControlEvents(historyLimit: 100, clientQueueLimit: 8)
        let idle = events.subscribe(lastEventID: nil)
        let reader = events.subscribe(lastEventID: nil)
        var got: [UInt64] = []
        for _ in 0..<30 {
            events.publish("output", [])
            if case .event(let event) = await events.next(reader) { got.append(event.id) }
        }
        #expect(got == Array(1...30))
        #expect(events.queued(idle) == -1, "dropped")
        guard case .dropped = await events.next(idle) else {
            Issue.record("the idle client was not told it was dropped")
            return
        }
        events.unsubscribe(idle)
        #expect(events.clientCount == 1)
    }

    /// `finish` ends waiting streams; queued events are still delivered first.
    @Test func finishEndsStreamsAfterTheirQueues() async {
        let events = ControlEvents()
        let subscription = events.subscribe(lastEventID: nil)
        events.publish("broadcast", [("state", .string("finished"))])
        events.finish()
        guard case .event(let last) = await events.next(subscription) else {
            Issue.record("queued event lost")
            return
        }
        #expect(last.id == 1)
        guard case .finished = await events.next(subscription) else {
            Issue.record("not finished")
            return
        }
    }

    @Test func encodesAsServerSentEvents() {
        let events = ControlEvents(clock: { "2026-11-25T10:00:00.000Z" })
        let subscription = events.subscribe(lastEventID: nil)
        events.publish("file", [("output", .string("rec")), ("path", .string("/r/a.mp4"))])
        #expect(events.queued(subscription) == 1)
        let text = String(decoding: ControlEvent(id: 7, type: "file", time: "T", fields: [("path", .string("/a"))]).encoded, as: UTF8.self)
        #expect(text == "id: 7\nevent: file\ndata: {\"time\":\"T\",\"path\":\"/a\"}\n\n")
        #expect(ControlEvents.now().hasSuffix("Z") && ControlEvents.now().count == 24)
    }
}
