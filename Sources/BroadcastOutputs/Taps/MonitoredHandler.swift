public import BroadcastKit

/// A handler whose delivered media also feeds the control page's preview and audio meters: it
/// passes every call on to `handler` and, on the session thread, offers each video frame to
/// `preview` (an atomic load; a copy only when a request waits) and each audio buffer to `levels`
/// (a copy into a preallocated ring). Neither waits, locks or allocates per buffer.
public final class MonitoredHandler: BroadcastSampleHandler {
    public let handler: any BroadcastSampleHandler
    private let preview: PreviewFrames?
    private let levels: LevelMeters?

    public init(_ handler: any BroadcastSampleHandler, preview: PreviewFrames?, levels: LevelMeters?) {
        self.handler = handler
        self.preview = preview
        self.levels = levels
    }

    public func broadcastStarted(setupInfo: SetupInfo) throws { try handler.broadcastStarted(setupInfo: setupInfo) }

    public func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        if type == .video { preview?.offer(buffer) } else { levels?.offer(buffer, of: type) }
        try handler.processSampleBuffer(buffer, of: type)
    }

    public func broadcastPaused() { handler.broadcastPaused() }
    public func broadcastResumed() { handler.broadcastResumed() }
    public func broadcastFinished() { handler.broadcastFinished() }
    public func sourceHealthChanged(_ health: CaptureHealth, of type: SampleBufferType) { handler.sourceHealthChanged(health, of: type) }
    public func controlRequested() { handler.controlRequested() }
}
