import Atomics

/// A lock-free multi-producer/single-consumer stack (Treiber): control calls from any thread
/// leave commands for the session thread, which takes them all at once. The consumer swaps the
/// whole list out, so there is no ABA problem; it restores order by the sequence number.
/// Also how save requests reach a replay buffer's thread.
public final class CommandStack<Value: Sendable>: @unchecked Sendable {
    final class Node: AtomicReference, @unchecked Sendable {
        let value: Value
        var next: Node?
        init(_ value: Value) { self.value = value }
    }

    private let top = ManagedAtomic<Node?>(nil)

    public init() {}

    public func push(_ value: Value) {
        let node = Node(value)
        var current = top.load(ordering: .acquiring)
        while true {
            node.next = current
            let (exchanged, original) = top.compareExchange(
                expected: current,
                desired: node,
                ordering: .acquiringAndReleasing
            )
            if exchanged { return }
            current = original
        }
    }

    /// Everything pushed so far, oldest first.
    public func takeAll() -> [Value] {
        var node = top.exchange(nil, ordering: .acquiringAndReleasing)
        var values: [Value] = []
        while let n = node {
            values.append(n.value)
            node = n.next
        }
        return values.reversed()
    }
}
