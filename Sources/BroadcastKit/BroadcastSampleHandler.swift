/// What a broadcast is handed to, mirroring ReplayKit's RPBroadcastSampleHandler.
///
/// A `BroadcastSession` calls these methods strictly serially: one returns before the next
/// starts, across all buffer types, so a handler keeps its state without locks. The calls come
/// from the session's thread (and `broadcastStarted` from the thread that starts the session).
///
/// To abort the broadcast (ReplayKit's `finishBroadcastWithError`), throw from
/// `broadcastStarted` or `processSampleBuffer`, or call `BroadcastSession.finishBroadcast(with:)`
/// from anywhere: the session stops its sources, calls `broadcastFinished()` and reports the error.
public protocol BroadcastSampleHandler: AnyObject {
    /// The broadcast begins; media time is zero now. Throwing aborts the start.
    func broadcastStarted(setupInfo: SetupInfo) throws
    /// One video frame or run of audio frames. `buffer` is valid only during this call.
    func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws
    /// No buffers are delivered until `broadcastResumed`; media time stands still meanwhile.
    func broadcastPaused()
    func broadcastResumed()
    /// The last call the handler gets, whether the broadcast ended normally or by an error.
    func broadcastFinished()
    /// The source of `type` lost its device or got it back. Buffers keep coming meanwhile (a
    /// "no signal" slate, silence), so outputs go on; this says what they show.
    func sourceHealthChanged(_ health: CaptureHealth, of type: SampleBufferType)
    /// Someone called the session's `requestControl()`: a turn on the session's thread between
    /// two buffers, also while paused (the built-in handler applies a reload's outputs here).
    func controlRequested()
}

extension BroadcastSampleHandler {
    public func broadcastPaused() {}
    public func broadcastResumed() {}
    public func sourceHealthChanged(_ health: CaptureHealth, of type: SampleBufferType) {}
    public func controlRequested() {}
}
