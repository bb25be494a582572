import Atomics
public import BroadcastKit

/// A fixed set of equally sized buffers a source fills and the session gives back after the
/// handler call, so steady-state capture allocates nothing. Lock-free: each buffer has an in-use flag.
public final class BufferPool: @unchecked Sendable {
    public final class Buffer: SampleBufferBacking, @unchecked Sendable {
        public let memory: UnsafeMutableRawPointer
        public let byteCount: Int
        /// Planes laid out in `memory`, made once so handing a buffer over allocates nothing.
        public let planes: [Plane]
        fileprivate let inUse = ManagedAtomic<Bool>(false)
        /// The pool's wake-up, held strongly: a buffer may come back after its pool is gone.
        fileprivate let poolWakeup: Wakeup?

        fileprivate init(poolWakeup: Wakeup?, byteCount: Int, planeLayout: [(offset: Int, count: Int, bytesPerRow: Int)]) {
            self.poolWakeup = poolWakeup
            self.byteCount = byteCount
            self.memory = .allocate(byteCount: max(byteCount, 1), alignment: 64)
            self.planes = planeLayout.map { [memory] in
                Plane(base: UnsafeRawPointer(memory + $0.offset), count: $0.count, bytesPerRow: $0.bytesPerRow)
            }
        }

        deinit { memory.deallocate() }

        public func release() {
            inUse.store(false, ordering: .releasing)
            poolWakeup?.wake()
        }
    }

    private var buffers: [Buffer] = []
    /// nil when the process had no descriptor left for its pipe: `acquire` then looks again every
    /// millisecond instead of sleeping until a buffer comes back (slower to notice, never stopped).
    private let wakeup = try? Wakeup()

    /// `count` buffers of `byteCount` bytes, each split into planes as `planeLayout` says.
    public init(count: Int, byteCount: Int, planeLayout: [(offset: Int, count: Int, bytesPerRow: Int)]) {
        buffers = (0..<count).map { _ in Buffer(poolWakeup: wakeup, byteCount: byteCount, planeLayout: planeLayout) }
    }

    /// A free buffer, marked in use. With `wait`, sleeps until one is given back or `shouldStop`
    /// says so; without, returns nil at once when all are in use. Call from the producer thread only.
    public func acquire(wait: Bool, shouldStop: () -> Bool) -> Buffer? {
        while true {
            // Lowest free buffer first, not round-robin: in steady state the same two or three
            // buffers go round (warm in cache), and the spares, there for when the session falls
            // behind, are never written, so the kernel never backs them with memory.
            for buffer in buffers {
                if buffer.inUse.compareExchange(expected: false, desired: true, ordering: .acquiring).exchanged {
                    return buffer
                }
            }
            if !wait || shouldStop() { return nil }
            guard let wakeup else {
                MonotonicClock.sleep(until: MonotonicClock().now() + 1_000_000)
                continue
            }
            wakeup.prepareToSleep()
            if buffers.contains(where: { !$0.inUse.load(ordering: .acquiring) }) {
                wakeup.cancelSleep()
                continue
            }
            wakeup.sleep(timeout: .milliseconds(50))
        }
    }
}
