import Atomics
import BroadcastKit
import BroadcastMedia
import Logging
import Testing

@testable import BroadcastOutputs

/// The WHIP worker against a fake WebRTC engine (a state machine's test, issue 35 item 19): what it
/// asks of the peer per packet. Real AAC packets from the real encoder; the worker's clock is the
/// test's, moved by hand.
@Suite struct WHIPWorkerTests {
    /// A clock that stands still until the test moves it.
    final class TestClock: Sendable {
        private let origin = MonotonicInstant.now()
        private let offset = ManagedAtomic<Int64>(0)
        func now() -> MonotonicInstant { origin.advanced(by: .nanoseconds(offset.load(ordering: .acquiring))) }
        func advance(_ duration: Duration) {
            offset.wrappingIncrement(by: Int64(duration.components.seconds * 1_000_000_000 + duration.components.attoseconds / 1_000_000_000), ordering: .releasing)
        }
    }

    /// Counts what the worker asks; always connected, never any RTCP trouble.
    final class CountingPeer: WebRTCPeer, @unchecked Sendable {
        let stateReads = ManagedAtomic<Int>(0)
        let pushes = ManagedAtomic<Int>(0)
        func offer(timeout: Duration, abandon: () -> Bool) throws(BroadcastError) -> String { "v=0\r\n" }
        func accept(answer: String) throws(BroadcastError) {}
        func push(_ packet: EncodedPacket, prefix: [UInt8], newest: Int64) -> Bool {
            pushes.wrappingIncrement(ordering: .relaxed)
            return true
        }
        var state: WebRTCConnectionState {
            stateReads.wrappingIncrement(ordering: .relaxed)
            return .connected
        }
        var keyframeRequests: Int { 0 }
        var rtcpReceived: (packets: Int, byes: Int) { (0, 0) }
        func figures() -> WebRTCFigures? { nil }
    }

    struct FakeEngine: WebRTCEngine {
        let peer: CountingPeer
        func makePeer(_ media: WebRTCMedia) throws(BroadcastError) -> any WebRTCPeer { peer }
        func request(
            method: String, url: String, token: String?, contentType: String?, body: String?, timeout: Duration,
            tls: TLSVerification, abandon: () -> Bool
        ) -> Result<HTTPAnswer, BroadcastError> {
            .success(HTTPAnswer(status: method == "POST" ? 201 : 200, body: "v=0\r\n", location: "http://127.0.0.1:9/session/1", links: [], contentType: nil))
        }
    }

    /// Waits (a guard against hanging, not a measurement) until `condition` holds.
    func waitUntil(_ condition: () -> Bool) async throws {
        for _ in 0..<3000 where !condition() { try await Task.sleep(for: .milliseconds(10)) }
        #expect(condition())
    }

    /// The peer's state (GStreamer's bus emptied, webrtcbin's property read under its lock) is
    /// looked at on the worker's tick, not for every packet: 400 packets while the clock stands
    /// still ask once; after the clock moves on by one interval, the next packet asks again. The
    /// old worker asked once per packet (401 reads for 400 packets).
    @Test func thePeersStateIsReadOnTheTickNotPerPacket() async throws {
        let logger = Logger(label: "test")
        let encoder = try AudioEncoder(globalHeader: false, streamIndex: 0, logger: logger)
        var packets: [EncodedPacket] = []
        var start: Int64 = 0
        while packets.count < 410 {
            packets += try encoder.encode(AudioChunk(startSample: start, channels: [[Float]](repeating: [Float](repeating: 0.1, count: 1024), count: 2)))
            start += 1024
        }
        let url = try StreamURL("whip+http://127.0.0.1:9/whip/x")
        let output = try Output(
            configuration: OutputConfiguration(name: "w", destination: .live(url)), keyframeRequest: ManagedAtomic(false),
            failedOutputs: ManagedAtomic(0), logger: logger)
        let clock = TestClock()
        let peer = CountingPeer()
        let worker = WHIPWorker(
            output: output, url: url, streams: [encoder.stream], engine: FakeEngine(peer: peer), logger: logger, clock: { clock.now() })
        output.start(worker)
        // Connected first: what waited longer than the drop threshold would be dropped at the start.
        try await waitUntil { output.state == .live }
        for packet in packets.prefix(400) { output.offer(packet) }
        try await waitUntil { peer.pushes.load(ordering: .relaxed) == 400 }
        // One read while connecting, one on the tick of the first packet.
        #expect(peer.stateReads.load(ordering: .relaxed) == 2, "\(peer.stateReads.load(ordering: .relaxed)) state reads for 400 packets; \(peer.pushes.load(ordering: .relaxed)) pushed; \(output.statistics())")
        clock.advance(WHIPWorker.livenessInterval)
        for packet in packets[400..<410] { output.offer(packet) }
        try await waitUntil { peer.pushes.load(ordering: .relaxed) == 410 }
        #expect(peer.stateReads.load(ordering: .relaxed) == 3, "\(peer.stateReads.load(ordering: .relaxed)) state reads after the tick")
        output.end()
        output.join()
    }
}
