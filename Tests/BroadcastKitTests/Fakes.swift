import Atomics
import BroadcastKit
import Synchronization

/// A clock the test moves by hand.
final class MockClock: BroadcastClock {
    private let nanoseconds = ManagedAtomic<Int64>(0)
    func now() -> Int64 { nanoseconds.load(ordering: .acquiring) }
    func set(_ value: Int64) { nanoseconds.store(value, ordering: .releasing) }
}

/// A realtime source the test feeds by hand through the sink the session gives it.
final class ManualSource: CaptureSource, @unchecked Sendable {
    let name = "manual"
    let isRealtime = true
    private let sinkBox = Mutex<SourceSink?>(nil)

    func start(into sink: SourceSink) throws { sinkBox.withLock { $0 = sink } }
    func stop() {}

    var sink: SourceSink? { sinkBox.withLock { $0 } }

    /// Hands one buffer over, waiting for room; `bytes` stays alive as the buffer's backing.
    @discardableResult
    func push(
        format: MediaFormat, at captureTime: Int64, durationNanoseconds: Int64, frames: Int = 0,
        changedRegions: [PixelRegion]? = nil
    ) -> Bool {
        let backing = Bytes(count: max(1, frames * 4))
        return sink!.push(
            CapturedBuffer(
                format: format,
                captureTime: captureTime,
                duration: MediaTime(nanoseconds: durationNanoseconds),
                planes: [Plane(base: backing.pointer, count: backing.count, bytesPerRow: backing.count)],
                frameCount: frames,
                changedRegions: changedRegions,
                backing: backing
            )
        )
    }
}

final class Bytes: SampleBufferBacking, @unchecked Sendable {
    let pointer: UnsafeMutableRawPointer
    let count: Int
    let released = ManagedAtomic<Int>(0)
    init(count: Int) {
        self.count = count
        pointer = .allocate(byteCount: count, alignment: 16)
        pointer.initializeMemory(as: UInt8.self, repeating: 0, count: count)
    }
    deinit { pointer.deallocate() }
    func release() { released.wrappingIncrement(ordering: .relaxed) }
}

/// A non-realtime source producing `count` tiny buffers on its own thread as fast as they are taken.
final class CountingSource: CaptureSource, @unchecked Sendable {
    let name = "counting"
    let isRealtime = false
    let count: Int
    let stepNanoseconds: Int64
    let format: MediaFormat
    private var thread: OSThread?
    let backing = Bytes(count: 16)

    init(count: Int, stepNanoseconds: Int64, format: MediaFormat) {
        self.count = count
        self.stepNanoseconds = stepNanoseconds
        self.format = format
    }

    func start(into sink: SourceSink) throws {
        let (count, step, format, backing) = (count, stepNanoseconds, format, backing)
        thread = OSThread(name: "test-fake") {
            for i in 0..<count {
                let buffer = CapturedBuffer(
                    format: format,
                    captureTime: sink.startTime + Int64(i) * step,
                    duration: MediaTime(nanoseconds: step),
                    planes: [Plane(base: backing.pointer, count: 16, bytesPerRow: 16)],
                    frameCount: format == videoFormat ? 0 : 1,
                    backing: nil
                )
                if !sink.push(buffer) { return }
            }
            sink.endOfStream()
        }
    }

    func stop() {
        thread?.join()
        thread = nil
    }
}

let videoFormat = MediaFormat.video(VideoFormat(pixelFormat: .yuv420p, width: 16, height: 16))
let audioFormat = MediaFormat.audio(AudioFormat(sampleFormat: .s16, sampleRate: 48_000, channels: 2))

/// What a handler saw, in order.
enum HandlerEvent: Equatable {
    case started
    case buffer(SampleBufferType, pts: Int64, duration: Int64, frames: Int)
    case paused
    case resumed
    case finished
}

/// Records every call, and checks that no two calls overlap.
final class RecordingHandler: BroadcastSampleHandler, @unchecked Sendable {
    private let inside = ManagedAtomic<Bool>(false)
    let overlaps = ManagedAtomic<Int>(0)
    let delivered = ManagedAtomic<Int>(0)
    private let log = Mutex<[HandlerEvent]>([])
    var keepEvents = true
    var failAfter: Int?

    var events: [HandlerEvent] { log.withLock { $0 } }

    private func enter() {
        if !inside.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged {
            overlaps.wrappingIncrement(ordering: .relaxed)
        }
    }
    private func leave() { inside.store(false, ordering: .releasing) }
    private func record(_ e: HandlerEvent) { if keepEvents { log.withLock { $0.append(e) } } }

    func broadcastStarted(setupInfo: SetupInfo) throws {
        enter(); defer { leave() }
        record(.started)
    }

    func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        enter(); defer { leave() }
        let n = delivered.wrappingIncrementThenLoad(ordering: .relaxed)
        record(.buffer(type, pts: buffer.presentationTime.nanoseconds!, duration: buffer.duration.nanoseconds!, frames: buffer.frameCount))
        if let failAfter, n >= failAfter {
            throw BroadcastError(.handlerAborted, "handler gave up after \(n) buffers")
        }
    }

    func broadcastPaused() {
        enter(); defer { leave() }
        record(.paused)
    }

    func broadcastResumed() {
        enter(); defer { leave() }
        record(.resumed)
    }

    func broadcastFinished() {
        enter(); defer { leave() }
        record(.finished)
    }
}

/// Runs `session` on a thread of its own; `result()` waits for it.
final class SessionRunner: @unchecked Sendable {
    private final class Outcome: @unchecked Sendable {
        let value = Mutex<Result<SessionSummary, any Error>?>(nil)
    }
    private let outcome = Outcome()
    private var thread: OSThread?

    init(_ session: BroadcastSession, setupInfo: SetupInfo = [:]) {
        let outcome = self.outcome
        thread = OSThread(name: "test-fake") {
            let r = Result { try session.run(setupInfo: setupInfo) }
            outcome.value.withLock { $0 = r }
        }
    }

    func result() -> Result<SessionSummary, any Error> {
        thread?.join()
        thread = nil
        return outcome.value.withLock { $0! }
    }
}

/// Polls `condition` until it holds (at most `seconds`).
func waitUntil(seconds: Double = 10, _ condition: () -> Bool) -> Bool {
    let deadline = MonotonicClock().now() + Int64(seconds * 1e9)
    while !condition() {
        if MonotonicClock().now() > deadline { return false }
        MonotonicClock.sleep(until: MonotonicClock().now() + 1_000_000)
    }
    return true
}
