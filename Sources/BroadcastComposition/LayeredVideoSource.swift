internal import Atomics
public import BroadcastKit
internal import BroadcastMedia
public import Logging

/// Several video sources as one: the first (the base) sets the frame's times and fills it, each
/// further one (a layer) is drawn over it in its box (`LayerPlacement`). To the session and every
/// handler (the built-in encoder and one of your own alike) it is one video source delivering
/// yuv420p frames at the output size, with what changed in `changedRegions`.
///
/// Threads: each source captures on its own thread at its own rate and format into a ring of its
/// own (`SourceSink.nested`, single producer, single consumer). The composite's thread ("bc-compose")
/// waits for the base's next frame only; at each it takes the newest picture of every layer that
/// has one (a late layer repeats its last one: nothing is waited for), converts the new ones, redraws
/// what changed and hands the frame on. A layer whose device is lost (`health`), that failed or
/// ended, hides or shows a slate (`LayerPlacement.onLoss`) and comes back with its next picture
/// once its source captures again. No lock anywhere on this path.
public final class LayeredVideoSource: CaptureSource, @unchecked Sendable {
    /// A layer: one of `inputs`, placed.
    public struct Layer: Sendable, Hashable {
        /// Index into `inputs`.
        public let input: Int
        public let placement: LayerPlacement
        public init(input: Int, placement: LayerPlacement) {
            self.input = input
            self.placement = placement
        }
    }

    /// A named layout: the layers drawn over the base, in order.
    public struct Scene: Sendable, Hashable {
        public let name: String
        public let layers: [Layer]
        public init(name: String, layers: [Layer]) {
            self.name = name
            self.layers = layers
        }
    }

    public let base: any CaptureSource
    /// Every source the scenes draw (each opened once, however many scenes show it): all of them
    /// capture all the time, so a switch shows a scene's pictures at its first frame.
    public let inputs: [any CaptureSource]
    /// The first is shown at the start.
    public let scenes: [Scene]
    public let width: Int
    public let height: Int
    /// What the composite's YUV is: the base's own when it says (a YUV camera, the test pattern:
    /// taken without a matrix change), else BT.709 from 720 lines, BT.601 below.
    public let colour: VideoColour
    public var isRealtime: Bool { base.isRealtime }
    public var name: String { "\(base.name) with \(inputs.map(\.name).joined(separator: ", ")) over it" }
    /// What the composite's frame pool may take (the memory budget's share); set before `start`.
    public var poolBytes = 16 << 20
    /// Bytes of one composite frame (yuv420p at the output size).
    public var frameBytes: Int { width * height * 3 / 2 }

    private let logger: Logger
    private let running = ManagedAtomic<Bool>(false)
    private let droppedFrames = ManagedAtomic<Int>(0)
    /// The base's frames its ring had no room for (the composite fell behind), copied from the
    /// ring's count by the composite's thread.
    private let baseRingDrops = ManagedAtomic<Int>(0)
    /// Set by an input's `fail`: it shows as lost from then on.
    private let inputFailed: [ManagedAtomic<Bool>]
    /// Per input, what the last frame showed of it (`Compositor.Shown.code`) and the pictures its
    /// ring had no room for: written by the composite's thread, read by the status.
    private let inputShown: [ManagedAtomic<Int>]
    private let inputRingDrops: [ManagedAtomic<Int>]
    private let composed = ManagedAtomic<Int>(0)
    private let redrawnPixels = ManagedAtomic<Int>(0)
    /// The scene asked for (any thread) and the one shown (the composite's thread), by index.
    private let requestedScene = ManagedAtomic<Int>(0)
    private let shownScene = ManagedAtomic<Int>(0)
    private var thread: OSThread?
    private var startedSources: [any CaptureSource] = []
    private var sinks: [SourceSink] = []

    public init(
        base: any CaptureSource, inputs: [any CaptureSource], scenes: [Scene], width: Int, height: Int, colour: VideoColour?,
        logger: Logger
    ) {
        precondition(!scenes.isEmpty, "a composite shows at least one scene")
        self.base = base
        self.inputs = inputs
        self.scenes = scenes
        self.width = width
        self.height = height
        self.colour = colour ?? (height >= 720 ? .bt709 : .bt601)
        self.logger = logger
        self.inputFailed = inputs.map { _ in ManagedAtomic(false) }
        self.inputShown = inputs.map { _ in ManagedAtomic(Compositor.Shown.hidden.code) }
        self.inputRingDrops = inputs.map { _ in ManagedAtomic(0) }
    }

    /// A layer of the scene shown, as the status says it.
    public struct LayerStatus: Sendable, Equatable {
        /// Its place in the scene: 1 is drawn first, over the base.
        public var index: Int
        public var name: String
        /// capturing, device-lost or failed.
        public var sourceState: String
        /// What the frames show in its box: picture, slate, or hidden (lost, or no picture yet).
        public var shown: String
        public var deviceLosses: Int
        /// Its pictures that its ring had no room for (the composite fell behind it).
        public var dropped: Int
    }

    /// The layers of the scene the last frame showed (any thread).
    public var layerStatuses: [LayerStatus] {
        scenes[shownScene.load(ordering: .relaxed)].layers.enumerated().map { position, layer in
            let input = inputs[layer.input]
            let health = input.health
            let state =
                inputFailed[layer.input].load(ordering: .relaxed) ? "failed" : health.state == .deviceLost ? "device-lost" : "capturing"
            return LayerStatus(
                index: position + 1, name: input.name, sourceState: state,
                shown: Compositor.Shown(code: inputShown[layer.input].load(ordering: .relaxed)).name,
                deviceLosses: health.deviceLosses,
                dropped: input.droppedCount + inputRingDrops[layer.input].load(ordering: .relaxed))
        }
    }

    public var health: CaptureHealth { base.health }
    public var droppedCount: Int {
        base.droppedCount + baseRingDrops.load(ordering: .relaxed) + droppedFrames.load(ordering: .relaxed)
    }
    /// Frames composed, and pixels drawn into the composite, since the start (tests, benchmarks).
    public var compositionStatistics: (frames: Int, pixels: Int) {
        (composed.load(ordering: .relaxed), redrawnPixels.load(ordering: .relaxed))
    }

    /// Whether input `index` shows as lost (its device gone, its source failed).
    public func inputIsLost(_ index: Int) -> Bool {
        inputFailed[index].load(ordering: .relaxed) || inputs[index].health.state == .deviceLost
    }

    /// What input `index`'s layers show once it is lost or failed (`on_loss`), for messages.
    func shownWhenLost(_ index: Int) -> String {
        let choices = Set(scenes.flatMap(\.layers).filter { $0.input == index }.map(\.placement.onLoss))
        switch choices {
        case [.slate]: return "shown as a slate"
        case [.hide]: return "hidden"
        default: return "hidden (a slate where on_loss=slate)"
        }
    }

    /// The scene asked for last (shown from the next frame on).
    public var scene: String { scenes[requestedScene.load(ordering: .relaxed)].name }
    /// The scene the last frame showed.
    public var shownSceneName: String { scenes[shownScene.load(ordering: .relaxed)].name }

    /// Shows scene `name` from the next frame on (any thread). Throws when there is none of that name.
    public func select(scene name: String) throws(BroadcastError) {
        guard let index = scenes.firstIndex(where: { $0.name == name }) else {
            throw BroadcastError(.invalidArgument, "no scene named \(name): scenes are \(scenes.map(\.name).joined(separator: ", "))")
        }
        requestedScene.store(index, ordering: .relaxed)
    }

    public func start(into sink: SourceSink) throws {
        let wakeup = try Wakeup()
        let sceneLayers = scenes.map { scene in
            scene.layers.map { Compositor.Layer(placement: $0.placement, box: $0.placement.box(frameWidth: width, frameHeight: height)) }
        }
        let compositor = try Compositor(width: width, height: height, colour: ColourDescription(colour), layers: sceneLayers[0])
        let baseSink = try SourceSink.nested(in: sink, capacity: 64, consumer: wakeup, onFailure: { sink.fail($0) })
        var inputSinks: [SourceSink] = []
        for (index, input) in inputs.enumerated() {
            // An input's pushes need not wake the composite: it looks at each base frame.
            let flag = inputFailed[index]
            let logger = self.logger
            let name = input.name
            let shown = shownWhenLost(index)
            inputSinks.append(
                try SourceSink.nested(in: sink, capacity: 4, consumer: try Wakeup(), onFailure: { error in
                    flag.store(true, ordering: .relaxed)
                    logger.warning("layer \(name) failed, \(shown) from now on: \(error.message)")
                }))
        }
        sinks = [baseSink] + inputSinks
        do {
            try base.start(into: baseSink)
            startedSources.append(base)
            for (input, inputSink) in zip(inputs, inputSinks) {
                try input.start(into: inputSink)
                startedSources.append(input)
            }
        } catch {
            stopSources()
            throw error
        }
        let pool = CompositeFramePool(count: max(4, min(poolBytes / max(frameBytes, 1), 60)), width: width, height: height)
        running.store(true, ordering: .releasing)
        thread = OSThread(name: "bc-compose") { [self, inputSinks] in
            run(into: sink, base: baseSink, inputSinks: inputSinks, wakeup: wakeup, compositor: compositor, sceneLayers: sceneLayers, pool: pool)
        }
    }

    public func stop() {
        running.store(false, ordering: .releasing)
        for sink in sinks { sink.stopForConsumer() }
        thread?.join()
        thread = nil
        stopSources()
        // What the sources handed over and the composite never took goes back to them.
        for sink in sinks {
            while let buffer = sink.takeNext() { buffer.backing?.release() }
        }
    }

    private func stopSources() {
        for source in startedSources { source.stop() }
        startedSources.removeAll()
    }

    private func run(
        into sink: SourceSink, base: SourceSink, inputSinks: [SourceSink], wakeup: Wakeup, compositor: Compositor,
        sceneLayers: [[Compositor.Layer]], pool: CompositeFramePool
    ) {
        let output = CompositeOutput(compositor: compositor, pool: pool)
        // Each input's newest picture, kept until the next one comes: a scene switched to shows
        // every one of its pictures at its first frame.
        var held = [CapturedBuffer?](repeating: nil, count: inputs.count)
        var fresh = [Bool](repeating: false, count: inputs.count)
        var current = 0
        defer {
            output.stop()
            for buffer in held { buffer?.backing?.release() }
        }
        while running.load(ordering: .acquiring) && !sink.isStopping {
            // `ended` before the ring: the producer pushes its last buffers, then says it ended.
            let ended = base.endedForConsumer
            guard let frame = base.takeNext() else {
                if ended {
                    sink.endOfStream()
                    return
                }
                wakeup.prepareToSleep()
                if base.waitingCount > 0 || base.endedForConsumer || sink.isStopping || !running.load(ordering: .acquiring) {
                    wakeup.cancelSleep()
                    continue
                }
                wakeup.sleep(timeout: .milliseconds(100))
                continue
            }
            baseRingDrops.store(base.droppedCount, ordering: .relaxed)
            do {
                try compositor.updateBase(frame)
            } catch {
                frame.backing?.release()
                sink.fail(BroadcastError(.sourceFailed, "composing the base picture: \(error)"))
                return
            }
            for (index, inputSink) in inputSinks.enumerated() {
                inputRingDrops[index].store(inputSink.droppedCount, ordering: .relaxed)
                fresh[index] = false
                guard let newest = inputSink.takeNewest() else { continue }
                held[index]?.backing?.release()
                held[index] = newest
                fresh[index] = true
            }
            let wanted = requestedScene.load(ordering: .relaxed)
            let switching = wanted != current
            if switching {
                current = wanted
                compositor.show(sceneLayers[current])
                shownScene.store(current, ordering: .relaxed)
            }
            for (position, layer) in scenes[current].layers.enumerated() {
                let lost = inputIsLost(layer.input)
                let show: Compositor.Shown = lost ? (layer.placement.onLoss == .slate ? .slate : .hidden) : .picture
                var picture = fresh[layer.input] || switching ? held[layer.input] : nil
                // Shown again after another scene: whatever it says changed is relative to a
                // picture this layer never drew.
                if switching { picture?.changedRegions = nil }
                do {
                    try compositor.updateLayer(position, with: lost ? nil : picture, show: show)
                } catch {
                    if !inputFailed[layer.input].exchange(true, ordering: .relaxed) {
                        logger.warning(
                            "layer \(inputs[layer.input].name) cannot be converted, \(shownWhenLost(layer.input)) from now on: \(error)")
                    }
                    try? compositor.updateLayer(position, with: nil, show: layer.placement.onLoss == .slate ? .slate : .hidden)
                }
                inputShown[layer.input].store(compositor.layers[position].shown.code, ordering: .relaxed)
            }
            let redrawn: Compositor.Redraw
            do {
                redrawn = try compositor.redraw()
            } catch {
                frame.backing?.release()
                sink.fail(BroadcastError(.sourceFailed, "composing: \(error)"))
                return
            }
            guard let (out, outChanged) = output.next(
                after: redrawn, wait: !isRealtime, shouldStop: { [running] in !running.load(ordering: .acquiring) || sink.isStopping })
            else {
                frame.backing?.release()
                if !isRealtime { return }
                droppedFrames.wrappingIncrement(ordering: .relaxed)
                continue
            }
            composed.wrappingIncrement(ordering: .relaxed)
            redrawnPixels.store(compositor.composedPixels, ordering: .relaxed)
            let captured = CapturedBuffer(
                format: .video(VideoFormat(pixelFormat: .yuv420p, width: width, height: height, colour: colour)),
                captureTime: frame.captureTime, duration: frame.duration, planes: out.planes,
                changedRegions: outChanged, backing: out)
            frame.backing?.release()
            if isRealtime {
                sink.offer(captured)
            } else if !sink.push(captured) {
                return
            }
        }
    }
}

/// What the composite's thread hands on at each frame: the composite copied into a free frame of
/// the pool, or the last frame again when nothing changed. The composite's thread only.
final class CompositeOutput {
    private let compositor: Compositor
    private let pool: CompositeFramePool
    /// The frame handed on last (its own reference, released when another replaces it).
    private var last: CompositeFrame?
    /// A composite was dropped (no frame free): the canvas holds what it changed, `last` does not,
    /// so the next frame is a new one, said to be changed everywhere.
    private var dropped = false

    init(compositor: Compositor, pool: CompositeFramePool) {
        self.compositor = compositor
        self.pool = pool
    }

    /// After the compositor's `redraw` answered `redrawn`: the frame to hand on, with a reference
    /// for the receiver, and what changed in it since the frame handed on before (nil: everything).
    /// Nil when no frame is free (`acquire`'s `wait` and `shouldStop`): this composite is dropped.
    func next(after redrawn: Compositor.Redraw, wait: Bool, shouldStop: () -> Bool) -> (frame: CompositeFrame, changed: [PixelRegion]?)? {
        if !dropped, redrawn == .nothing, let last {
            // Nothing changed: the last composite again, nothing drawn or copied.
            last.retain()
            return (last, [])
        }
        guard let free = pool.acquire(wait: wait, shouldStop: shouldStop) else {
            dropped = true
            return nil
        }
        compositor.copyComposite(into: free.planes)
        last?.release()
        last = free
        free.retain()
        let whole = dropped
        dropped = false
        guard redrawn == .regions, !whole else { return (free, nil) }
        // Into the frame's own array: no one else holds it once the frame is free (the session
        // lets go of a buffer before it releases its backing), so this allocates nothing.
        free.changed.removeAll(keepingCapacity: true)
        for region in compositor.redrawnRegions { free.changed.append(region) }
        return (free, free.changed)
    }

    /// Lets go of the last frame.
    func stop() {
        last?.release()
        last = nil
    }
}

/// A composite picture the session holds: counted references (the composite keeps the last one to
/// send again when nothing changed; each delivery adds one), free again at zero.
final class CompositeFrame: SampleBufferBacking, @unchecked Sendable {
    let memory: UnsafeMutableRawPointer
    let planes: [Plane]
    /// What changed in this frame, handed on with it (the composite's thread writes it while it
    /// holds the only reference).
    var changed: [PixelRegion] = []
    fileprivate let references = ManagedAtomic<Int>(0)
    private let pool: Wakeup?

    init(width: Int, height: Int, pool: Wakeup?) {
        let luma = width * height
        let chroma = (width / 2) * (height / 2)
        memory = .allocate(byteCount: luma + 2 * chroma, alignment: 64)
        planes = [
            Plane(base: UnsafeRawPointer(memory), count: luma, bytesPerRow: width),
            Plane(base: UnsafeRawPointer(memory + luma), count: chroma, bytesPerRow: width / 2),
            Plane(base: UnsafeRawPointer(memory + luma + chroma), count: chroma, bytesPerRow: width / 2),
        ]
        self.pool = pool
        changed.reserveCapacity(64)
    }

    deinit { memory.deallocate() }

    func retain() { references.wrappingIncrement(ordering: .relaxed) }

    func release() {
        if references.wrappingDecrementThenLoad(ordering: .acquiringAndReleasing) == 0 { pool?.wake() }
    }
}

/// The composite's frames, lowest free first (as `BufferPool`: spares never written cost nothing).
final class CompositeFramePool: @unchecked Sendable {
    private let frames: [CompositeFrame]
    private let wakeup = try? Wakeup()

    init(count: Int, width: Int, height: Int) {
        let wakeup = self.wakeup
        frames = (0..<count).map { _ in CompositeFrame(width: width, height: height, pool: wakeup) }
    }

    /// A frame no one holds, with the caller's reference; nil when all are held (and not `wait`).
    func acquire(wait: Bool, shouldStop: () -> Bool) -> CompositeFrame? {
        while true {
            for frame in frames where frame.references.compareExchange(expected: 0, desired: 1, ordering: .acquiring).exchanged {
                return frame
            }
            if !wait || shouldStop() { return nil }
            guard let wakeup else {
                MonotonicClock.sleep(until: MonotonicClock().now() + 1_000_000)
                continue
            }
            wakeup.prepareToSleep()
            if frames.contains(where: { $0.references.load(ordering: .acquiring) == 0 }) {
                wakeup.cancelSleep()
                continue
            }
            wakeup.sleep(timeout: .milliseconds(50))
        }
    }
}
