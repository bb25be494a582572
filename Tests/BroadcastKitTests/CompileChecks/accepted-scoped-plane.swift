// A handler that reads a buffer's bytes inside the call: accepted.
import BroadcastKit

final class Meter: BroadcastSampleHandler {
    var total = 0
    var kept: SampleBuffer?

    func broadcastStarted(setupInfo: SetupInfo) throws {}
    func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
        for index in 0..<buffer.planeCount {
            total += buffer.withPlane(index) { bytes, _ in bytes.byteCount }
        }
        kept = buffer.copy()  // an owned copy may be kept
    }
    func broadcastPaused() {}
    func broadcastResumed() {}
    func broadcastFinished() {}
}
