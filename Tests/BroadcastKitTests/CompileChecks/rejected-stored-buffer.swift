// A handler that tries to keep the borrowed buffer itself: rejected.
import BroadcastKit

final class Keeper: BroadcastSampleHandler {
    var kept: SampleBuffer?
    func broadcastStarted(setupInfo: SetupInfo) throws {}
    func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        kept = buffer
    }
    func broadcastPaused() {}
    func broadcastResumed() {}
    func broadcastFinished() {}
}
