@testable import BroadcastCapture
import Foundation
import Testing

@Suite("Test pattern painting")
struct TestPatternPainterTests {
    @Test("repainting a buffer that held an earlier frame gives exactly a fresh frame", arguments: [(320, 180), (1280, 720), (64, 36)])
    func incrementalRepaintMatchesAFreshPaint(width: Int, height: Int) {
        let painter = TestPatternPainter(width: width, height: height)
        let size = width * height * 3 / 2
        // Three pool buffers used round-robin (the worst case: each has missed two frames), and one
        // scratch buffer filled with noise before each fresh paint so nothing is inherited.
        let pool = (0..<3).map { _ in UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 64) }
        let fresh = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 64)
        defer {
            pool.forEach { $0.deallocate() }
            fresh.deallocate()
        }
        var held: [TestPatternPainter.Regions?] = [nil, nil, nil]
        var mismatches: [Int64] = []
        for frame in Int64(0)..<200 {
            // Frame numbers jump (1, 10, 100 digits: the clock's box grows) and a flash comes every 30.
            let time = frame * 33_366_667
            let flash = frame % 30 == 29
            let slot = Int(frame % 3)
            held[slot] = painter.paint(into: pool[slot], over: held[slot], frameIndex: frame, mediaTimeNanoseconds: time, flash: flash)
            fresh.initializeMemory(as: UInt8.self, repeating: UInt8(truncatingIfNeeded: frame &* 37), count: size)
            painter.paint(into: fresh, over: nil, frameIndex: frame, mediaTimeNanoseconds: time, flash: flash)
            if memcmp(pool[slot], fresh, size) != 0 { mismatches.append(frame) }
        }
        #expect(mismatches.isEmpty, "frames that differ from a fresh paint: \(mismatches.prefix(10))")
    }
}
