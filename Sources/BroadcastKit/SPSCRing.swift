import Atomics

/// A bounded single-producer/single-consumer ring: the hand-off from a capture thread to the
/// session (and from the encoder to an output). Lock-free: one atomic index per side.
///
/// Exactly one thread may call `push`, and exactly one (other) thread `peek`/`pop`.
public final class SPSCRing<Element: Sendable>: @unchecked Sendable {
    public let capacity: Int
    private let mask: Int
    private let slots: UnsafeMutablePointer<Element?>
    /// Next slot to read; written by the consumer only.
    private let head = ManagedAtomic<Int>(0)
    /// Next slot to write; written by the producer only.
    private let tail = ManagedAtomic<Int>(0)

    /// `capacity` is rounded up to a power of two.
    public init(capacity: Int) {
        precondition(capacity > 0, "SPSCRing capacity must be positive")
        var size = 1
        while size < capacity { size <<= 1 }
        self.capacity = size
        self.mask = size - 1
        self.slots = .allocate(capacity: size)
        self.slots.initialize(repeating: nil, count: size)
    }

    deinit {
        slots.deinitialize(count: capacity)
        slots.deallocate()
    }

    /// Producer side: appends `element`, or returns false (and keeps nothing) when the ring is full.
    @discardableResult
    public func push(_ element: Element) -> Bool {
        let t = tail.load(ordering: .relaxed)
        if t - head.load(ordering: .acquiring) == capacity { return false }
        slots[t & mask] = element
        tail.store(t + 1, ordering: .releasing)
        return true
    }

    /// Consumer side: the oldest element without removing it.
    public func peek() -> Element? {
        let h = head.load(ordering: .relaxed)
        if h == tail.load(ordering: .acquiring) { return nil }
        return slots[h & mask]
    }

    /// Consumer side: removes and returns the oldest element.
    public func pop() -> Element? {
        let h = head.load(ordering: .relaxed)
        if h == tail.load(ordering: .acquiring) { return nil }
        let element = slots[h & mask].take()
        head.store(h + 1, ordering: .releasing)
        return element
    }

    /// Elements in the ring (exact only on the consumer or producer thread; a hint elsewhere).
    public var count: Int { tail.load(ordering: .acquiring) - head.load(ordering: .acquiring) }
    public var isEmpty: Bool { count == 0 }
}
