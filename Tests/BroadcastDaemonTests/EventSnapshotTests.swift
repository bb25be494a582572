import BroadcastService
import Testing

@testable import BroadcastDaemon

/// `EventSnapshot.changes(since:)`: which events `/v1/events` publishes between two looks at the
/// daemon's state, without a daemon (the end-to-end suites show them over the socket).
@Suite struct EventSnapshotTests {
    final class Token {}

    static func names(_ events: [(String, [(String, JSONValue)])]) -> [String] { events.map(\.0) }

    /// The drop counts a `drops` event is published for, a count growing one by one.
    static func announced(upTo total: Int) -> [Int] {
        let token = Token()
        var last = EventSnapshot(session: ObjectIdentifier(token))
        last.broadcast = "started"
        var announced: [Int] = []
        for count in 0...total {
            var now = last
            now.drops = [.init(scope: "output", name: "live", count: count)]
            for (name, fields) in now.changes(since: last) where name == "drops" {
                if case .number(let n)? = fields.first(where: { $0.0 == "dropped" })?.1 { announced.append(Int(n)) }
            }
            last = now
        }
        return announced
    }

    @Test func bandsArePowersOfTwo() {
        #expect(EventSnapshot.dropBand(0) == 0)
        #expect(EventSnapshot.dropBand(-3) == 0)
        #expect((1...3).map(EventSnapshot.dropBand) == [1, 2, 2])
        #expect(EventSnapshot.dropBand(4) == 3 && EventSnapshot.dropBand(7) == 3 && EventSnapshot.dropBand(8) == 4)
        #expect(EventSnapshot.dropBand(Int.max) == 63)
    }

    /// A steady loss is announced at the first drop and then ever less often: at each power of two.
    @Test func aGrowingCountIsAnnouncedAtEachPowerOfTwo() {
        #expect(Self.announced(upTo: 1000) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    }

    /// A burst that crosses several bands between two looks is one event, with the count it reached.
    @Test func aBurstIsOneEvent() {
        let token = Token()
        var before = EventSnapshot(session: ObjectIdentifier(token))
        before.broadcast = "started"
        before.drops = [.init(scope: "type", name: "video", count: 1)]
        var after = before
        after.drops = [.init(scope: "type", name: "video", count: 300)]
        let events = after.changes(since: before)
        #expect(Self.names(events) == ["drops"])
        #expect(events.first?.1.contains { $0.0 == "type" && $0.1 == .string("video") } == true)
        // Within the band: nothing.
        var more = after
        more.drops = [.init(scope: "type", name: "video", count: 500)]
        #expect(more.changes(since: after).isEmpty)
    }

    /// A new broadcast (another session) starts its counts, devices and outputs afresh: its first
    /// drop is announced even if the last broadcast had dropped more, and it is "started".
    @Test func aNewSessionStartsAfresh() {
        let one = Token(), two = Token()
        var old = EventSnapshot(session: ObjectIdentifier(one))
        old.broadcast = "finished"
        old.drops = [.init(scope: "output", name: "rec", count: 40)]
        old.outputs = [.init(name: "rec", state: "finished", files: 1, lastFile: "/r/a.mp4")]
        var new = EventSnapshot(session: ObjectIdentifier(two))
        new.broadcast = "started"
        new.drops = [.init(scope: "output", name: "rec", count: 1)]
        new.outputs = [.init(name: "rec", state: "recording", files: 0, lastFile: nil)]
        new.devices = [("video", false)]
        #expect(Self.names(new.changes(since: old)) == ["broadcast", "output", "drops"])
    }

    @Test func pauseResumeAndDevices() {
        let token = Token()
        var started = EventSnapshot(session: ObjectIdentifier(token))
        started.broadcast = "started"
        started.devices = [("video", false)]
        var paused = started
        paused.broadcast = "paused"
        paused.devices = [("video", true)]
        let events = paused.changes(since: started)
        #expect(Self.names(events) == ["broadcast", "device"])
        #expect(events[0].1.first?.1 == .string("paused"))
        #expect(events[1].1.contains { $0.0 == "state" && $0.1 == .string("lost") })
        var resumed = paused
        resumed.broadcast = "started"
        resumed.devices = [("video", false)]
        let back = resumed.changes(since: paused)
        #expect(back[0].1.first?.1 == .string("resumed"))
        #expect(back[1].1.contains { $0.0 == "state" && $0.1 == .string("back") })
        // Nothing changed: nothing published.
        #expect(resumed.changes(since: resumed).isEmpty)
    }
}
