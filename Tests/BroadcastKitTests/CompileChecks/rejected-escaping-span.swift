// A handler that tries to keep a plane's bytes beyond the call by returning the span: rejected.
import BroadcastKit

final class Keeper: BroadcastSampleHandler {
    func broadcastStarted(setupInfo: SetupInfo) throws {}
    func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        let escaped: RawSpan = buffer.withPlane(0) { bytes, _ in bytes }
        _ = escaped
    }
    func broadcastPaused() {}
    func broadcastResumed() {}
    func broadcastFinished() {}
}
