import Atomics
public import BroadcastKit
internal import CALSA
internal import CDeviceShim
public import Logging

#if canImport(Glibc)
import Glibc
#endif

/// What to ask an ALSA PCM for. The device may answer with something near it (a `hw:` device
/// offers what its hardware does; `plughw:` and `default` convert).
public struct ALSAOptions: Sendable {
    public var sampleRate: Int
    public var channels: Int
    /// Frames per period: one buffer handed to the session per period (1024 = 21 ms at 48 kHz).
    public var periodFrames: Int

    public init(sampleRate: Int = 48_000, channels: Int = 2, periodFrames: Int = 1024) {
        self.sampleRate = sampleRate
        self.channels = channels
        self.periodFrames = periodFrames
    }
}

/// Audio from an ALSA capture PCM (`hw:1,0`, `plughw:CARD=Loopback,DEV=1`, `default`), read a
/// period at a time on a thread of its own. Serves `.audioMic` and `.audioApp` alike.
///
/// Timestamps: the PCM's status timestamp (htstamp, CLOCK_MONOTONIC) gives the capture time of
/// each period; buffers are stamped by sample count from the first one, so audio has no jitter
/// gaps, and re-anchored when the two part by more than 30 ms (an xrun). The drift of the device's
/// clock against the monotonic clock is measured (`driftPPM`) and handed on with the buffers; the
/// encoder side resamples it away (see docs/DESIGN.md, drift correction).
public final class ALSASource: CaptureSource, @unchecked Sendable {
    public let pcmName: String
    public let isRealtime = true
    public var name: String { pcmName }
    /// The format the PCM was configured to, e.g. s16 48000 Hz 2 ch.
    public let format: AudioFormat
    public let periodFrames: Int

    private let logger: Logger
    private var pcm: OpaquePointer?
    private var thread: OSThread?
    private let running = ManagedAtomic<Bool>(false)
    let xruns = ManagedAtomic<Int>(0)
    let periodsCaptured = ManagedAtomic<Int>(0)
    /// Periods read but not handed over: every pooled buffer was still with the session.
    let droppedPeriods = ManagedAtomic<Int>(0)
    /// Silent periods delivered while the device was gone.
    let silentPeriods = ManagedAtomic<Int>(0)
    let deviceLosses = ManagedAtomic<Int>(0)
    /// Times the timeline moved to the device's time (samples lost without an overrun reported).
    let reanchorCount = ManagedAtomic<Int>(0)
    private let gone = ManagedAtomic<Bool>(false)
    /// Drift in millionths of a ppm (an Int so it can be atomic); Int64.min = not measured yet.
    let driftMicroPPM = ManagedAtomic<Int>(Int.min)

    public struct Statistics: Sendable, Hashable {
        public var periodsCaptured: Int
        /// Overruns recovered with snd_pcm_recover.
        public var xruns: Int
        /// Periods read but dropped because the session still held every buffer.
        public var droppedPeriods: Int
        /// Silent periods delivered while the device was gone.
        public var silentPeriods: Int
        public var deviceLosses: Int
        /// The device clock against CLOCK_MONOTONIC (positive: the device runs fast); nil until measured.
        public var driftPPM: Double?
    }

    public var statistics: Statistics {
        let drift = driftMicroPPM.load(ordering: .relaxed)
        return Statistics(
            periodsCaptured: periodsCaptured.load(ordering: .relaxed),
            xruns: xruns.load(ordering: .relaxed),
            droppedPeriods: droppedPeriods.load(ordering: .relaxed),
            silentPeriods: silentPeriods.load(ordering: .relaxed),
            deviceLosses: deviceLosses.load(ordering: .relaxed),
            driftPPM: drift == Int.min ? nil : Double(drift) / 1e6
        )
    }

    /// Overruns plus periods dropped for want of a buffer.
    public var droppedCount: Int { xruns.load(ordering: .relaxed) + droppedPeriods.load(ordering: .relaxed) }

    public var health: CaptureHealth {
        CaptureHealth(state: gone.load(ordering: .relaxed) ? .deviceLost : .capturing, deviceLosses: deviceLosses.load(ordering: .relaxed))
    }

    /// Opens and configures `pcmName` at once, so a bad name is reported before anything starts.
    public init(pcmName: String, options: ALSAOptions = ALSAOptions(), logger: Logger) throws(BroadcastError) {
        self.pcmName = pcmName
        self.logger = logger
        CBroadcast_alsa_silence_errors()
        let opened = try Self.open(pcmName, options: options)
        pcm = opened.pcm
        format = opened.format
        periodFrames = opened.periodFrames
    }

    deinit {
        if let pcm { snd_pcm_close(pcm) }
    }

    static func message(_ code: Int32) -> String { String(cString: snd_strerror(code)) }

    /// Opens the PCM for capture and negotiates sample format (S16_LE, S32_LE, FLOAT_LE, in that
    /// order), channels, rate and period near what `options` asks.
    static func open(_ name: String, options: ALSAOptions) throws(BroadcastError) -> (pcm: OpaquePointer, format: AudioFormat, periodFrames: Int) {
        var handle: OpaquePointer?
        let rc = snd_pcm_open(&handle, name, SND_PCM_STREAM_CAPTURE, 0)
        guard rc == 0, let pcm = handle else {
            if rc == -EBUSY {
                throw BroadcastError(.invalidArgument, "ALSA device '\(name)' is busy: another program is capturing from it")
            }
            let devices = DeviceDiscovery.audioCaptureDevices()
            let list = devices.isEmpty
                ? "no ALSA capture devices found"
                : "capture devices: " + devices.map { "\($0.pcm) (\($0.numericPCM), \($0.name))" }.joined(separator: ", ")
            throw BroadcastError(.invalidArgument, "cannot open ALSA capture device '\(name)': \(message(rc)) (\(list))")
        }
        func fail(_ what: String, _ code: Int32) -> BroadcastError {
            snd_pcm_close(pcm)
            return BroadcastError(.invalidArgument, "ALSA device '\(name)': \(what): \(message(code))")
        }
        var hw: OpaquePointer?
        snd_pcm_hw_params_malloc(&hw)
        defer { snd_pcm_hw_params_free(hw) }
        var code = snd_pcm_hw_params_any(pcm, hw)
        if code < 0 { throw fail("no hardware configuration", code) }
        code = snd_pcm_hw_params_set_access(pcm, hw, SND_PCM_ACCESS_RW_INTERLEAVED)
        if code < 0 { throw fail("interleaved read access not supported", code) }
        let candidates: [(snd_pcm_format_t, AudioSampleFormat)] = [
            (SND_PCM_FORMAT_S16_LE, .s16), (SND_PCM_FORMAT_S32_LE, .s32), (SND_PCM_FORMAT_FLOAT_LE, .f32),
        ]
        guard let chosen = candidates.first(where: { snd_pcm_hw_params_test_format(pcm, hw, $0.0) == 0 }) else {
            throw fail("offers none of S16_LE, S32_LE, FLOAT_LE", -EINVAL)
        }
        code = snd_pcm_hw_params_set_format(pcm, hw, chosen.0)
        if code < 0 { throw fail("setting the sample format", code) }
        var channels = UInt32(options.channels)
        code = snd_pcm_hw_params_set_channels_near(pcm, hw, &channels)
        if code < 0 { throw fail("setting \(options.channels) channels", code) }
        var rate = UInt32(options.sampleRate)
        var dir: Int32 = 0
        code = snd_pcm_hw_params_set_rate_near(pcm, hw, &rate, &dir)
        if code < 0 { throw fail("setting \(options.sampleRate) Hz", code) }
        var period = snd_pcm_uframes_t(options.periodFrames)
        code = snd_pcm_hw_params_set_period_size_near(pcm, hw, &period, &dir)
        if code < 0 { throw fail("setting a period of \(options.periodFrames) frames", code) }
        // Latency is the period (each is read as soon as it is complete); the buffer is only slack
        // for a capture thread that runs late (a loaded or emulated machine): half a second, at
        // least 8 periods.
        let periods = max(8, (snd_pcm_uframes_t(rate) / 2 + period - 1) / max(period, 1))
        var bufferSize = period * periods
        code = snd_pcm_hw_params_set_buffer_size_near(pcm, hw, &bufferSize)
        if code < 0 { throw fail("setting a buffer of \(period * periods) frames", code) }
        code = snd_pcm_hw_params(pcm, hw)
        if code < 0 {
            throw fail("configuring \(chosen.1.rawValue) \(rate) Hz \(channels) ch", code)
        }
        snd_pcm_hw_params_get_period_size(hw, &period, &dir)

        var sw: OpaquePointer?
        snd_pcm_sw_params_malloc(&sw)
        defer { snd_pcm_sw_params_free(sw) }
        snd_pcm_sw_params_current(pcm, sw)
        snd_pcm_sw_params_set_tstamp_mode(pcm, sw, SND_PCM_TSTAMP_ENABLE)
        snd_pcm_sw_params_set_tstamp_type(pcm, sw, SND_PCM_TSTAMP_TYPE_MONOTONIC)
        snd_pcm_sw_params_set_avail_min(pcm, sw, period)
        code = snd_pcm_sw_params(pcm, sw)
        if code < 0 { throw fail("setting software parameters", code) }
        code = snd_pcm_prepare(pcm)
        if code < 0 { throw fail("preparing", code) }
        return (pcm, AudioFormat(sampleFormat: chosen.1, sampleRate: Int(rate), channels: Int(channels)), Int(period))
    }

    public func start(into sink: SourceSink) throws {
        guard let pcm else { throw BroadcastError(.sourceFailed, "ALSA device '\(pcmName)': the source was already started") }
        self.pcm = nil
        let code = snd_pcm_start(pcm)
        if code < 0 {
            snd_pcm_close(pcm)
            throw BroadcastError(.sourceFailed, "ALSA device '\(pcmName)': cannot start capture: \(Self.message(code))")
        }
        logger.info("\(pcmName): capturing \(format), \(periodFrames) frames a period")
        running.store(true, ordering: .releasing)
        let handle = PCMHandle(pcm)
        thread = OSThread(name: "bc-alsa") { [self] in capture(handle, into: sink) }
    }

    public func stop() {
        running.store(false, ordering: .releasing)
        thread?.join()
        thread = nil
    }

    /// The PCM moved to the capture thread, which closes it.
    private struct PCMHandle: @unchecked Sendable {
        let pointer: OpaquePointer
        init(_ pointer: OpaquePointer) { self.pointer = pointer }
    }

    /// The capture thread's state from one period to the next.
    private struct CaptureState {
        /// nil while the device is gone.
        var pcm: OpaquePointer?
        var timeline: AudioTimeline
        /// While the device is gone: capture time of the next silent period.
        var nextSilence: Int64 = 0
        /// While the device is gone: when to try to open it again.
        var nextReopen: Int64 = 0
    }

    /// The capture thread's buffers: the pool the periods are read into, and where a period the
    /// session has no room for is read to be dropped.
    private struct PeriodBuffers {
        let pool: BufferPool
        let scratch: UnsafeMutableRawPointer
    }

    /// Bytes of a whole period.
    private var periodBytes: Int { periodFrames * format.bytesPerFrame }
    private var periodNanoseconds: Int64 { Int64(periodFrames) * 1_000_000_000 / Int64(format.sampleRate) }

    /// The capture thread: a period at a time from the device, or silence while it is gone.
    private func capture(_ handle: PCMHandle, into sink: SourceSink) {
        let bytes = periodBytes
        // More buffers than the session's queue holds: when the session falls behind, its queue
        // fills (and drops) first, and the read loop never has to leave periods in the device.
        let pool = BufferPool(count: 96, byteCount: bytes, planeLayout: [(0, bytes, bytes)])
        let scratch = UnsafeMutableRawPointer.allocate(byteCount: max(bytes, 1), alignment: 64)
        defer { scratch.deallocate() }
        let buffers = PeriodBuffers(pool: pool, scratch: scratch)
        var state = CaptureState(pcm: handle.pointer, timeline: AudioTimeline(sampleRate: format.sampleRate))

        while running.load(ordering: .acquiring) && !sink.isStopping {
            if let device = state.pcm {
                readPeriod(from: device, &state, buffers, into: sink)
            } else {
                whileGone(&state, buffers, into: sink)
            }
        }
        let pcm = state.pcm
        let timeline = state.timeline
        if let pcm {
            snd_pcm_drop(pcm)
            snd_pcm_close(pcm)
        }
        let stats = statistics
        logger.info("\(pcmName): \(stats.periodsCaptured) periods, \(stats.xruns) overruns, \(stats.droppedPeriods) dropped (session behind), \(stats.silentPeriods) silent while lost, \(reanchorCount.load(ordering: .relaxed)) re-anchored, \(timeline.strayCount) stamps counted through a stall, drift \(stats.driftPPM.map { "\(($0 * 10).rounded() / 10) ppm" } ?? "not measured")")
    }

    /// The device went away: silence at the nominal rate (audio stays continuous), and a try to
    /// get it back twice a second.
    private func whileGone(_ state: inout CaptureState, _ buffers: PeriodBuffers, into sink: SourceSink) {
        let now = sink.clock.now()
        if now >= state.nextReopen {
            state.nextReopen = now + 500_000_000
            if reopen(&state) { return }
        }
        fillSilence(&state, until: now, buffers, into: sink)
        usleep(20_000)
    }

    /// Opens the device again, if it is back with the same format and period, and starts it. A
    /// device that opens but will not do (another format, or it does not start) is closed again:
    /// left open, it would hold a `hw:` device busy against every later try.
    private func reopen(_ state: inout CaptureState) -> Bool {
        guard
            let reopened = try? Self.open(
                pcmName, options: ALSAOptions(sampleRate: format.sampleRate, channels: format.channels, periodFrames: periodFrames))
        else { return false }
        guard reopened.format == format, reopened.periodFrames == periodFrames, snd_pcm_start(reopened.pcm) >= 0 else {
            snd_pcm_close(reopened.pcm)
            return false
        }
        state.pcm = reopened.pcm
        state.timeline.restart()
        gone.store(false, ordering: .relaxed)
        logger.notice("\(pcmName): back")
        return true
    }

    /// Delivers the silent periods due by `now` (as many as there are free buffers), catching up
    /// at most a second.
    private func fillSilence(_ state: inout CaptureState, until now: Int64, _ buffers: PeriodBuffers, into sink: SourceSink) {
        let bytes = periodBytes
        let periodNanoseconds = self.periodNanoseconds
        if now - state.nextSilence > 1_000_000_000 { state.nextSilence = now - periodNanoseconds }
        while state.nextSilence + periodNanoseconds <= now, let buffer = buffers.pool.acquire(wait: false, shouldStop: { false }) {
            buffer.memory.initializeMemory(as: UInt8.self, repeating: 0, count: bytes)
            sink.offer(
                CapturedBuffer(
                    format: .audio(format), captureTime: state.nextSilence,
                    duration: MediaTime(value: Int64(periodFrames), timescale: Int32(format.sampleRate)),
                    planes: buffer.planes, frameCount: periodFrames, backing: buffer
                )
            )
            silentPeriods.wrappingIncrement(ordering: .relaxed)
            state.nextSilence += periodNanoseconds
        }
    }

    /// Waits for a period, reads it into a pool buffer, stamps it and hands it on.
    private func readPeriod(from device: OpaquePointer, _ state: inout CaptureState, _ buffers: PeriodBuffers, into sink: SourceSink) {
        let waited = snd_pcm_wait(device, 200)
        if waited == 0 { return }
        guard let buffer = buffers.pool.acquire(wait: false, shouldStop: { false }) else {
            dropPeriod(from: device, &state, into: buffers.scratch, sink: sink)
            return
        }
        let read = snd_pcm_readi(device, buffer.memory, snd_pcm_uframes_t(periodFrames))
        if read < 0 {
            buffer.release()
            recover(device, from: Int32(read), &state, sink: sink)
            return
        }
        let frames = Int(read)
        if frames == 0 {
            buffer.release()
            return
        }
        let captureTime = stamp(frames: frames, from: device, &state, sink: sink)
        periodsCaptured.wrappingIncrement(ordering: .relaxed)
        // A whole period (every read but a short one): the pool buffer's own plane array, so
        // the steady state allocates nothing; a short read needs a plane of its own length.
        let planes =
            frames == periodFrames
            ? buffer.planes
            : [Plane(base: UnsafeRawPointer(buffer.memory), count: frames * format.bytesPerFrame, bytesPerRow: frames * format.bytesPerFrame)]
        sink.offer(
            CapturedBuffer(
                format: .audio(format),
                captureTime: captureTime,
                duration: MediaTime(value: Int64(frames), timescale: Int32(format.sampleRate)),
                planes: planes,
                frameCount: frames,
                backing: buffer
            )
        )
    }

    /// Every buffer is still with the session: reads the period anyway and drops it, so the
    /// device does not overrun (which would cost a recovery and more samples).
    private func dropPeriod(from device: OpaquePointer, _ state: inout CaptureState, into scratch: UnsafeMutableRawPointer, sink: SourceSink) {
        let read = snd_pcm_readi(device, scratch, snd_pcm_uframes_t(periodFrames))
        if read > 0 {
            droppedPeriods.wrappingIncrement(ordering: .relaxed)
            // The next period comes after this one, not in its place, and says it follows a loss.
            state.timeline.skip(frames: Int(read))
            sink.noteLoss()
        }
        else if read < 0 { _ = snd_pcm_recover(device, Int32(read), 1) }
    }

    /// A read failed with `code`: an overrun is recovered (and the timeline restarted where the
    /// device says, samples were lost); a device that cannot be recovered is closed, and silence
    /// follows until it is back.
    private func recover(_ device: OpaquePointer, from code: Int32, _ state: inout CaptureState, sink: SourceSink) {
        if code == -EAGAIN { return }
        if code == -EPIPE || code == -ESTRPIPE {
            xruns.wrappingIncrement(ordering: .relaxed)
            logger.debug("\(pcmName): overrun, recovering")
        }
        if snd_pcm_recover(device, code, 1) < 0 || code == -ENODEV {
            logger.warning("\(pcmName): device lost (\(Self.message(code))); sending silence and retrying")
            snd_pcm_close(device)
            state.pcm = nil
            deviceLosses.wrappingIncrement(ordering: .relaxed)
            gone.store(true, ordering: .relaxed)
            state.nextSilence = sink.clock.now()
        } else {
            snd_pcm_start(device)
            // Samples were lost: the next period starts where the device says it does.
            state.timeline.restart()
            sink.noteLoss()
        }
    }

    /// The capture time of the `frames` just read: when the device's status timestamp says its
    /// first sample came in (on the monotonic clock; else the time now less the period), placed on
    /// the timeline by sample count (re-anchored when the two part). Updates the drift measured.
    private func stamp(frames: Int, from device: OpaquePointer, _ state: inout CaptureState, sink: SourceSink) -> Int64 {
        var available: snd_pcm_uframes_t = 0
        var stamp = timespec()
        let now = sink.clock.now()
        var observed = now - Int64(frames) * 1_000_000_000 / Int64(format.sampleRate)
        if sink.clock is MonotonicClock, snd_pcm_htimestamp(device, &available, &stamp) == 0, stamp.tv_sec > 0 {
            let statusTime = Int64(stamp.tv_sec) * 1_000_000_000 + Int64(stamp.tv_nsec)
            if abs(statusTime - now) < 1_000_000_000 {
                observed = DeviceTimestamps.audioCaptureTime(
                    statusTime: statusTime, framesRead: frames, framesAvailable: Int(available), sampleRate: format.sampleRate
                )
            }
        }
        let reanchors = state.timeline.reanchorCount
        let captureTime = state.timeline.place(frames: frames, observedTime: observed)
        if state.timeline.reanchorCount != reanchors {
            reanchorCount.wrappingIncrement(ordering: .relaxed)
            logger.info("\(pcmName): timestamps moved by \(Double(state.timeline.lastReanchorNanoseconds / 10_000) / 100) ms (the device's time stayed that far from the sample count; \(available) frames were waiting)")
        }
        if let drift = state.timeline.driftPPM { driftMicroPPM.store(Int(drift * 1e6), ordering: .relaxed) }
        return captureTime
    }
}
