import Atomics
import BroadcastKit
import Synchronization
import Testing

/// Producers of one sink, and whether two ever pushed at once (an SPSC ring allows one).
final class ProducerGuard: Sendable {
    let active = ManagedAtomic<Int>(0)
    let overlaps = ManagedAtomic<Int>(0)
    /// Capture times for the type, shared by every source of it: one timeline across a swap.
    let nextCapture = ManagedAtomic<Int64>(0)
    let log = Mutex<[String]>([])
}

/// A source on its own thread that pushes (waiting for room) until stopped; counts what it handed over.
final class ThreadedSource: CaptureSource, @unchecked Sendable {
    let name: String
    var isRealtime = false
    let format: MediaFormat
    let step: Int64
    let producers: ProducerGuard
    let pushed = ManagedAtomic<Int>(0)
    private let running = ManagedAtomic<Bool>(false)
    private var thread: OSThread?
    private let backing = Bytes(count: 64)
    var failsToStart = false

    init(name: String, format: MediaFormat, step: Int64, producers: ProducerGuard) {
        self.name = name
        self.format = format
        self.step = step
        self.producers = producers
    }

    func start(into sink: SourceSink) throws {
        producers.log.withLock { $0.append("start \(name)") }
        if failsToStart { throw BroadcastError(.sourceFailed, "\(name) cannot start") }
        running.store(true, ordering: .releasing)
        let (format, step, producers, backing, pushed, running) = (format, step, producers, backing, pushed, running)
        thread = OSThread(name: "test-fake") {
            while running.load(ordering: .acquiring) && !sink.isStopping {
                if producers.active.wrappingIncrementThenLoad(ordering: .acquiringAndReleasing) > 1 {
                    producers.overlaps.wrappingIncrement(ordering: .relaxed)
                }
                let time = sink.startTime + producers.nextCapture.loadThenWrappingIncrement(by: step, ordering: .relaxed)
                let ok = sink.push(
                    CapturedBuffer(
                        format: format, captureTime: time, duration: MediaTime(nanoseconds: step),
                        planes: [Plane(base: backing.pointer, count: 16, bytesPerRow: 16)],
                        frameCount: format == videoFormat ? 0 : 1))
                if ok { pushed.wrappingIncrement(ordering: .relaxed) }
                producers.active.wrappingDecrement(ordering: .acquiringAndReleasing)
            }
        }
    }

    func stop() {
        running.store(false, ordering: .releasing)
        thread?.join()
        if thread != nil { producers.log.withLock { $0.append("stopped \(name)") } }
        thread = nil
    }
}

/// A device that, like a V4L2 node, is busy while buffers of an earlier capture are still out.
final class ExclusiveDevice: Sendable {
    let outstanding = ManagedAtomic<Int>(0)
}

/// A buffer's backing that gives the device's buffer back when the session releases it.
final class DeviceBuffer: SampleBufferBacking, @unchecked Sendable {
    let device: ExclusiveDevice
    init(_ device: ExclusiveDevice) {
        self.device = device
        device.outstanding.wrappingIncrement(ordering: .relaxed)
    }
    func release() { device.outstanding.wrappingDecrement(ordering: .releasing) }
}

/// A source on an `ExclusiveDevice`: it cannot start while the device has buffers out.
final class DeviceSource: CaptureSource, @unchecked Sendable {
    let name: String
    let isRealtime = false
    let device: ExclusiveDevice
    let producers: ProducerGuard
    let pushed = ManagedAtomic<Int>(0)
    private let running = ManagedAtomic<Bool>(false)
    private var thread: OSThread?
    private let bytes = Bytes(count: 64)

    init(name: String, device: ExclusiveDevice, producers: ProducerGuard) {
        self.name = name
        self.device = device
        self.producers = producers
    }

    func start(into sink: SourceSink) throws {
        if device.outstanding.load(ordering: .acquiring) > 0 {
            throw BroadcastError(.sourceFailed, "\(name): busy, \(device.outstanding.load(ordering: .relaxed)) buffers of the last capture still out")
        }
        running.store(true, ordering: .releasing)
        let (device, producers, bytes, pushed, running) = (device, producers, bytes, pushed, running)
        thread = OSThread(name: "test-fake") {
            while running.load(ordering: .acquiring) && !sink.isStopping {
                let time = sink.startTime + producers.nextCapture.loadThenWrappingIncrement(by: 33_333, ordering: .relaxed)
                let ok = sink.push(
                    CapturedBuffer(
                        format: videoFormat, captureTime: time, duration: MediaTime(nanoseconds: 33_333),
                        planes: [Plane(base: bytes.pointer, count: 16, bytesPerRow: 16)], backing: DeviceBuffer(device)))
                if ok { pushed.wrappingIncrement(ordering: .relaxed) }
            }
        }
    }

    func stop() {
        running.store(false, ordering: .releasing)
        thread?.join()
        thread = nil
    }
}

/// A handler that takes its time over each buffer (an encoder on a slow machine).
final class SlowHandler: BroadcastSampleHandler, @unchecked Sendable {
    let delivered = ManagedAtomic<Int>(0)
    func broadcastStarted(setupInfo: SetupInfo) throws {}
    func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        MonotonicClock.sleep(until: MonotonicClock().now() + 1_000_000)
        delivered.wrappingIncrement(ordering: .relaxed)
    }
    func broadcastFinished() {}
}

@Suite struct SourceReplacementTests {
    /// The same device with other settings: it is busy until the session has delivered (and so
    /// released) the old capture's queued buffers. The replacement waits for them instead of
    /// failing (what the VM showed with vivid: EBUSY, the fallback busy too, no video any more).
    @Test func aReplacementOnTheSameDeviceWaitsForItsBuffers() throws {
        let device = ExclusiveDevice()
        let producers = ProducerGuard()
        let first = DeviceSource(name: "camera YUYV", device: device, producers: producers)
        let second = DeviceSource(name: "camera YU12", device: device, producers: producers)
        let handler = SlowHandler()
        let session = BroadcastSession(handler: handler, sources: [(.video, first)], options: SessionOptions(queueCapacity: 16))
        let runner = SessionRunner(session)
        #expect(waitUntil { first.pushed.load(ordering: .relaxed) > 40 })
        // The queue is full of the first capture's buffers now (the handler is slow).
        try session.replaceSource(of: .video, with: { second })
        #expect(waitUntil { second.pushed.load(ordering: .relaxed) > 20 })
        try session.finish()
        let summary = try runner.result().get()
        #expect(summary.statistics[.video]?.droppedOutOfOrder == 0)
        #expect(session.currentSources.first?.source === second)
    }
    /// Video and microphone run; the microphone source is replaced twice while video goes on:
    /// every video buffer produced is delivered (none lost, none out of order), the new audio
    /// source feeds the same type on the same timeline, and the two audio producers never overlap.
    @Test func replacingOneSourceKeepsTheOtherWhole() throws {
        let handler = RecordingHandler()
        handler.keepEvents = false
        let videoProducers = ProducerGuard()
        let audioProducers = ProducerGuard()
        let video = ThreadedSource(name: "video", format: videoFormat, step: 33_333, producers: videoProducers)
        let first = ThreadedSource(name: "mic-1", format: audioFormat, step: 10_000, producers: audioProducers)
        let second = ThreadedSource(name: "mic-2", format: audioFormat, step: 10_000, producers: audioProducers)
        let third = ThreadedSource(name: "mic-3", format: audioFormat, step: 10_000, producers: audioProducers)
        let session = BroadcastSession(
            handler: handler, sources: [(.video, video), (.audioMic, first)], options: SessionOptions(queueCapacity: 8))
        let runner = SessionRunner(session)
        #expect(waitUntil { first.pushed.load(ordering: .relaxed) > 2000 })
        try session.replaceSource(of: .audioMic, with: { second })
        #expect(waitUntil { second.pushed.load(ordering: .relaxed) > 2000 })
        try session.replaceSource(of: .audioMic, with: { third })
        #expect(waitUntil { third.pushed.load(ordering: .relaxed) > 2000 })
        try session.finish()
        let summary = try runner.result().get()

        #expect(audioProducers.log.withLock { $0 } == ["start mic-1", "stopped mic-1", "start mic-2", "stopped mic-2", "start mic-3", "stopped mic-3"])
        #expect(audioProducers.overlaps.load(ordering: .relaxed) == 0)
        #expect(handler.overlaps.load(ordering: .relaxed) == 0)
        let videoStats = try #require(summary.statistics[.video])
        let audioStats = try #require(summary.statistics[.audioMic])
        // Nothing is left in the rings at finish that was pushed: what was pushed was delivered,
        // or dropped at the end (finish does not drain); during the swaps nothing went.
        #expect(videoStats.droppedOutOfOrder == 0 && audioStats.droppedOutOfOrder == 0)
        #expect(videoStats.droppedQueueFull == 0 && audioStats.droppedQueueFull == 0)
        let pushedVideo = video.pushed.load(ordering: .relaxed)
        let pushedAudio = [first, second, third].map { $0.pushed.load(ordering: .relaxed) }.reduce(0, +)
        #expect(videoStats.delivered <= pushedVideo && videoStats.delivered >= pushedVideo - 8)
        #expect(audioStats.delivered <= pushedAudio && audioStats.delivered >= pushedAudio - 8)
        #expect(first.pushed.load(ordering: .relaxed) + second.pushed.load(ordering: .relaxed) < audioStats.delivered)
    }

    /// A replacement that cannot start puts the old settings back (the fallback) and says why.
    @Test func aFailedReplacementFallsBack() throws {
        let handler = RecordingHandler()
        handler.keepEvents = false
        let producers = ProducerGuard()
        let video = ThreadedSource(name: "video", format: videoFormat, step: 33_333, producers: ProducerGuard())
        let first = ThreadedSource(name: "mic-1", format: audioFormat, step: 10_000, producers: producers)
        let broken = ThreadedSource(name: "broken", format: audioFormat, step: 10_000, producers: producers)
        broken.failsToStart = true
        let again = ThreadedSource(name: "mic-1 again", format: audioFormat, step: 10_000, producers: producers)
        let session = BroadcastSession(handler: handler, sources: [(.video, video), (.audioMic, first)])
        let runner = SessionRunner(session)
        #expect(waitUntil { first.pushed.load(ordering: .relaxed) > 100 })
        let error = #expect(throws: BroadcastError.self) {
            try session.replaceSource(of: .audioMic, with: { broken }, fallback: { again }, patience: .zero)
        }
        #expect(error?.message.contains("broken cannot start") == true)
        #expect(waitUntil { again.pushed.load(ordering: .relaxed) > 100 })
        // A type the session was not started with cannot be added by a replacement.
        let missing = #expect(throws: BroadcastError.self) { try session.replaceSource(of: .audioApp, with: { broken }) }
        #expect(missing?.code == .invalidArgument)
        try session.finish()
        _ = try runner.result().get()
        #expect(producers.log.withLock { $0 } == ["start mic-1", "stopped mic-1", "start broken", "start mic-1 again", "stopped mic-1 again"])
        #expect(producers.overlaps.load(ordering: .relaxed) == 0)
        // After the finish nothing is replaced any more.
        let late = #expect(throws: BroadcastError.self) { try session.replaceSource(of: .audioMic, with: { again }) }
        #expect(late?.code == .illegalTransition)
    }

    /// A replacement of the other pacing (realtime for a source that is not) is refused at its first
    /// build, not tried again for the whole patience: waiting cannot change what a source is.
    @Test func aReplacementOfTheOtherPacingIsRefusedAtOnce() throws {
        let handler = RecordingHandler()
        handler.keepEvents = false
        let producers = ProducerGuard()
        let video = ThreadedSource(name: "video", format: videoFormat, step: 33_333, producers: ProducerGuard())
        let first = ThreadedSource(name: "mic-1", format: audioFormat, step: 10_000, producers: producers)
        let again = ThreadedSource(name: "mic-1 again", format: audioFormat, step: 10_000, producers: producers)
        let session = BroadcastSession(handler: handler, sources: [(.video, video), (.audioMic, first)])
        let runner = SessionRunner(session)
        #expect(waitUntil { first.pushed.load(ordering: .relaxed) > 100 })
        let builds = ManagedAtomic<Int>(0)
        let error = #expect(throws: BroadcastError.self) {
            try session.replaceSource(
                of: .audioMic,
                with: {
                    builds.wrappingIncrement(ordering: .relaxed)
                    let paced = ThreadedSource(name: "paced", format: audioFormat, step: 10_000, producers: producers)
                    paced.isRealtime = true
                    return paced
                },
                fallback: { again }, patience: .seconds(3))
        }
        #expect(error?.code == .invalidArgument)
        #expect(error?.message.contains("one is realtime, the other not") == true)
        #expect(builds.load(ordering: .relaxed) == 1)
        #expect(waitUntil { again.pushed.load(ordering: .relaxed) > 100 })
        try session.finish()
        _ = try runner.result().get()
        #expect(producers.log.withLock { $0 } == ["start mic-1", "stopped mic-1", "start mic-1 again", "stopped mic-1 again"])
    }
}
