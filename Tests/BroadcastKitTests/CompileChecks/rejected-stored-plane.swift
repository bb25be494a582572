// A handler that tries to keep the raw plane (its pointer) beyond the call: rejected.
import BroadcastKit

final class Keeper: BroadcastSampleHandler {
    var kept: Plane?
    func broadcastStarted(setupInfo: SetupInfo) throws {}
    func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        kept = buffer.planes[0]
    }
    func broadcastPaused() {}
    func broadcastResumed() {}
    func broadcastFinished() {}
}
