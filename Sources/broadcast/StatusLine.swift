import Atomics
import BroadcastDaemon
import BroadcastKit
import BroadcastOutputs
import BroadcastService

#if canImport(Glibc)
import Glibc
#endif

/// The live progress report: rewritten in place twice a second on a terminal (like ffmpeg's), a plain
/// line every five seconds otherwise (a log, the journal).
final class StatusLine: Sendable {
    struct Snapshot: Sendable {
        var session: [SampleBufferType: SampleBufferStatistics]
        var encoding: EncodingStatistics
        var state: SessionLifecycle.State
        /// Per-output state; the line shows live outputs and any output that is not doing its job.
        var outputs: [OutputStatistics] = []
        /// The process's footprint (private dirty bytes, see `ProcessMemory`) and its budget.
        var memory: ProcessMemory? = nil
        var memoryBudget: Int64? = nil
    }

    private let running = ManagedAtomic<Bool>(true)
    private let interactive: Bool
    private let thread: OSThread

    init(snapshot: @escaping @Sendable () -> Snapshot) {
        let interactive = isatty(2) != 0
        self.interactive = interactive
        let running = self.running
        thread = OSThread(name: "bc-status") {
            let clock = MonotonicClock()
            let start = clock.now()
            let period: Int64 = interactive ? 500_000_000 : 5_000_000_000
            var next = start + period
            var lastFrames = 0
            var lastTime = start
            while running.load(ordering: .acquiring) {
                // Sleep in short steps so stopping is prompt.
                while running.load(ordering: .acquiring) && clock.now() < next {
                    MonotonicClock.sleep(until: min(next, clock.now() + 100_000_000))
                }
                guard running.load(ordering: .acquiring) else { break }
                let now = clock.now()
                let s = snapshot()
                let frames = s.encoding.videoFramesEncoded
                let fps = Double(frames - lastFrames) / (Double(now - lastTime) / 1e9)
                lastFrames = frames
                lastTime = now
                let line = StatusLine.format(s, fps: fps, wallNanoseconds: now - start)
                FileStandardError.write(interactive ? "\r\(line)\u{1B}[K" : "\(line)\n")
                next += period
            }
            if interactive { FileStandardError.write("\n") }
        }
    }

    func stop() {
        running.store(false, ordering: .releasing)
        thread.join()
    }

    static func format(_ s: Snapshot, fps: Double, wallNanoseconds: Int64) -> String {
        let media = s.session.values.map(\.mediaTimeNanoseconds).max() ?? 0
        let dropped = s.session.values.reduce(0) { $0 + $1.droppedQueueFull + $1.droppedBySource }
        let speed = wallNanoseconds > 0 ? Double(media) / Double(wallNanoseconds) : 0
        var line = "elapsed=\(clock(wallNanoseconds)) frame=\(s.encoding.videoFramesEncoded) fps=\(fixed(fps, 1)) time=\(clock(media))"
        line += " bitrate=\(fixed(Double(s.encoding.bitrate) / 1000, 1))kbit/s size=\(bytes(s.encoding.bytesWritten))"
        line += " dropped=\(dropped) speed=\(fixed(speed, 2))x"
        if let memory = s.memory {
            line += " mem=\(bytes(memory.privateDirtyBytes))"
            if let budget = s.memoryBudget { line += "/\(bytes(budget))" }
        }
        if s.encoding.undecodableFrames > 0 { line += " damaged=\(s.encoding.undecodableFrames)" }
        if s.state == .paused { line += " [paused]" }
        for (type, stats) in s.session.sorted(by: { $0.key.rawValue < $1.key.rawValue }) where stats.sourceHealth.state == .deviceLost {
            line += " [\(type): no device]"
        }
        if s.encoding.failedOutputs > 0 { line += " failed-outputs=\(s.encoding.failedOutputs)" }
        for output in s.outputs where output.isLive || output.state == .failed || output.state == .paused {
            line += " | " + outputPart(output)
        }
        return line
    }

    /// "rtmp://host/app/**** live 2510kbit/s backlog=120ms drops=backlog-ref:12,keyframe-wait:40"
    static func outputPart(_ o: OutputStatistics) -> String {
        var part = "\(o.target) \(o.state)"
        if o.state == .reconnecting, o.attempt > 0 { part += " \(o.attempt)" }
        if o.isLive {
            part += " \(o.bitrate / 1000)kbit/s backlog=\(o.backlogMilliseconds)ms"
            if let target = o.targetBitrate, let maximum = o.maximumBitrate, target < maximum {
                part += " adapting: \(Self.megabits(target)) of \(Self.megabits(maximum)) Mb/s"
            }
        }
        if !o.drops.isEmpty { part += " drops=" + dropList(o.drops) }
        return part
    }

    /// 1100000 → "1.1".
    static func megabits(_ bitsPerSecond: Int) -> String {
        let tenths = (bitsPerSecond + 50_000) / 100_000
        return "\(tenths / 10).\(tenths % 10)"
    }

    static func dropList(_ drops: [DropReason: Int]) -> String {
        drops.sorted { $0.key.rawValue < $1.key.rawValue }.map { "\($0.key):\($0.value)" }.joined(separator: ",")
    }

    /// The end-of-run line for one output: what it sent, dropped and went through.
    static func summary(_ o: OutputStatistics) -> String {
        var line = "\(o.target): \(o.state), \(o.videoPacketsSent) video and \(o.audioPacketsSent) audio packets, "
        line += bytes(o.bytesSent)
        if o.isLive {
            line += ", reconnects=\(o.reconnects), max-backlog=\(o.maxBacklogMilliseconds)ms"
            line += ", drops=\(o.drops.isEmpty ? "0" : dropList(o.drops))"
        }
        if let error = o.lastError, o.state == .failed || o.isLive { line += "; last error: \(error)" }
        return line
    }

    /// HH:MM:SS.cc
    static func clock(_ nanoseconds: Int64) -> String { MediaClockText.format(nanoseconds) }

    static func bytes(_ count: Int64) -> String {
        if count >= 1 << 30 { return "\(fixed(Double(count) / Double(1 << 30), 2)) GiB" }
        if count >= 1 << 20 { return "\(fixed(Double(count) / Double(1 << 20), 1)) MiB" }
        return "\(count / 1024) KiB"
    }

    static func fixed(_ value: Double, _ digits: Int) -> String {
        guard value.isFinite else { return "-" }
        var scale = 1.0
        for _ in 0..<digits { scale *= 10 }
        let r = (value * scale).rounded() / scale
        var text = "\(r)"
        if let dot = text.firstIndex(of: ".") {
            let decimals = text.distance(from: dot, to: text.endIndex) - 1
            if decimals < digits { text += String(repeating: "0", count: digits - decimals) }
        } else if digits > 0 {
            text += "." + String(repeating: "0", count: digits)
        }
        return text
    }
}
