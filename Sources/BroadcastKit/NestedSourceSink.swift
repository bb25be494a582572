/// A source inside another source (a layer of a composite picture): its own ring on the outer
/// sink's clock, drained by the outer source's thread instead of the session's.
///
/// The same single-producer/single-consumer hand-off as the session's: the inner source's thread
/// is the one producer, the outer source's thread the one consumer. No lock.
extension SourceSink {
    /// A sink on `outer`'s clock and start time whose pushes wake `consumer` (the outer source's
    /// thread sleeps on it); `onFailure` hears a `fail` of the inner source.
    public static func nested(
        in outer: SourceSink, capacity: Int, consumer: Wakeup,
        onFailure: @escaping @Sendable (BroadcastError) -> Void
    ) throws(BroadcastError) -> SourceSink {
        SourceSink(
            type: outer.type, clock: outer.clock, startTime: outer.startTime, capacity: capacity,
            sessionWakeup: consumer, spaceWakeup: try Wakeup(), onFailure: onFailure)
    }

    /// Consumer: the oldest buffer handed over, or nil.
    public func takeNext() -> CapturedBuffer? {
        guard let buffer = ring.pop() else { return nil }
        tookBuffer()
        return buffer
    }

    /// Consumer: the newest buffer handed over, the older ones released unread; nil when none came.
    /// A layer that repeats its last picture when nothing new came takes this at each output frame.
    public func takeNewest() -> CapturedBuffer? {
        var newest: CapturedBuffer?
        while let buffer = ring.pop() {
            if let older = newest {
                older.backing?.release()
                // What changed since the unread one is not all that changed since the last read.
                newest = buffer
                newest?.changedRegions = nil
            } else {
                newest = buffer
            }
        }
        if newest != nil { tookBuffer() }
        return newest
    }

    /// Consumer: whether the inner source said it has nothing more (read before the ring, as the
    /// session does: the producer pushes its last buffers, then stores `ended`).
    public var endedForConsumer: Bool { hasEnded }

    /// Consumer: buffers waiting.
    public var waitingCount: Int { ring.count }

    /// Consumer: the outer source stops; a waiting `push` of the inner source gives up.
    public func stopForConsumer() { requestStop() }
}
