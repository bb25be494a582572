import BroadcastCapture
import BroadcastKit
import MallocInterposerSwift
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The design's promise that capture allocates nothing per buffer once running: the test pattern
/// and tone through the session into a handler that does nothing, counted by malloc-interposer
/// (linked into the test binary, so every malloc/calloc/realloc/posix_memalign of the process
/// goes through it).
///
/// Counted in an exit test: the body runs in a process of its own, so no other test's threads
/// allocate in the window. Only the capture path's threads are counted there: the sources' own
/// ("bc-" names) and the session's (the thread that calls the handler); the test runner's are not.
/// The counting starts after a warm-up (pools, queues, first-time setup) and covers `window` buffers.
@Suite struct SteadyStateAllocationTests {
    /// The interposer's per-allocation hook: counts the allocations of the capture path's threads.
    enum CaptureThreads {
        static let allocations = Atomic<Int>(0)
        /// The session's thread (where the handler is called), once known.
        static let sessionThread = Atomic<UInt>(0)
        /// pthread_getname_np (a GNU function Glibc's Swift module leaves out); for the calling
        /// thread it is a prctl, no allocation.
        typealias GetName = @convention(c) (pthread_t, UnsafeMutablePointer<CChar>, Int) -> Int32
        static let getName: GetName = unsafeBitCast(dlsym(nil, "pthread_getname_np")!, to: GetName.self)

        static func isCapturePath() -> Bool {
            let me = pthread_self()
            if UInt(me) == sessionThread.load(ordering: .relaxed) { return true }
            var name: (CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar) =
                (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
            return withUnsafeMutableBytes(of: &name) { raw in
                let chars = raw.baseAddress!.assumingMemoryBound(to: CChar.self)
                guard getName(me, chars, 16) == 0 else { return false }
                return raw[0] == UInt8(ascii: "b") && raw[1] == UInt8(ascii: "c") && raw[2] == UInt8(ascii: "-")
            }
        }

        typealias Backtrace = @convention(c) (UnsafeMutablePointer<UnsafeMutableRawPointer?>, Int32) -> Int32
        static let backtrace: Backtrace = unsafeBitCast(dlsym(nil, "backtrace")!, to: Backtrace.self)
        /// dladdr, a GNU function Glibc's Swift module leaves out; its Dl_info is four pointers:
        /// file name, file base, symbol name, symbol address.
        typealias DlAddr = @convention(c) (UnsafeRawPointer, UnsafeMutablePointer<UnsafeRawPointer?>) -> Int32
        static let dladdr: DlAddr = unsafeBitCast(dlsym(nil, "dladdr")!, to: DlAddr.self)

        /// False for the Swift runtime's own bookkeeping: a malloc called from inside libswiftCore
        /// other than through swift_slowAlloc (which every Swift object, array and string storage
        /// goes through). In a debug build, unspecialised generic code (every `for x in array`)
        /// runs the collection's `subscript.read` coroutine, whose frame the runtime mallocs; an
        /// optimised build specialises it away. Everything else counts: Swift objects and any C
        /// library's malloc.
        static func isCounted() -> Bool {
            // On the stack: the hook's own frames, the interposer's, then the allocation's caller.
            return withUnsafeTemporaryAllocation(of: UnsafeMutableRawPointer?.self, capacity: 32) { buffer -> Bool in
                    let frames = buffer.baseAddress!
                    let n = backtrace(frames, 32)
                    // No `for in` here: a debug build's iterator would malloc, inside the allocator.
                    var inInterposer = false
                    var i = 0
                    while i < Int(n) {
                        defer { i += 1 }
                        var info: (UnsafeRawPointer?, UnsafeRawPointer?, UnsafeRawPointer?, UnsafeRawPointer?) = (nil, nil, nil, nil)
                        guard let address = frames[i] else { continue }
                        let found = withUnsafeMutablePointer(to: &info) { tuple in
                            tuple.withMemoryRebound(to: UnsafeRawPointer?.self, capacity: 4) { dladdr(address, $0) }
                        }
                        guard found != 0, let fileName = info.0 else { continue }
                        let file = fileName.assumingMemoryBound(to: CChar.self)
                        if contains(file, "libMallocInterposerSwift") {
                            inInterposer = true
                            continue
                        }
                        guard inInterposer else { continue }
                        // The allocation's caller.
                        guard contains(file, "libswiftCore") else { return true }
                        guard let symbol = info.2 else { return false }
                        return strcmp(symbol.assumingMemoryBound(to: CChar.self), cString("swift_slowAlloc")) == 0
                    }
                    return true
            }
        }

        /// A literal as a C string without converting a String (which would allocate, in the allocator).
        static func cString(_ s: StaticString) -> UnsafePointer<CChar> {
            UnsafeRawPointer(s.utf8Start).assumingMemoryBound(to: CChar.self)
        }

        static func contains(_ text: UnsafePointer<CChar>, _ part: StaticString) -> Bool { strstr(text, cString(part)) != nil }

        static let hook: MallocInterposerSwift.AllocationHook = { _ in
            if isCapturePath(), isCounted() { allocations.add(1, ordering: .relaxed) }
        }

        /// Touches the statics, so their one-time initialisation happens before counting.
        static func prepare() {
            _ = allocations.load(ordering: .relaxed)
            _ = sessionThread.load(ordering: .relaxed)
            _ = getName
            _ = isCapturePath()
            _ = isCounted()
        }
    }

    /// Counts the buffers it is given; opens the counting window after `warmUp` of them and closes
    /// it `window` later. Allocates nothing itself in between.
    final class NullHandler: BroadcastSampleHandler, @unchecked Sendable {
        let warmUp: Int
        let window: Int
        private var buffers = 0
        private(set) var counted = false

        init(warmUp: Int, window: Int) {
            self.warmUp = warmUp
            self.window = window
        }

        func broadcastStarted(setupInfo: SetupInfo) throws {}
        func broadcastFinished() {}

        func processSampleBuffer(_ buffer: borrowing SampleBuffer, of type: SampleBufferType) throws {
            buffers += 1
            if buffers == warmUp {
                CaptureThreads.sessionThread.store(UInt(pthread_self()), ordering: .relaxed)
                CaptureThreads.allocations.store(0, ordering: .relaxed)
                MallocInterposerSwift.hook()
            } else if buffers == warmUp + window {
                MallocInterposerSwift.unhook()
                counted = true
            }
        }
    }

    /// Runs the session until `warmUp + window` buffers were delivered; returns the allocations
    /// the capture path's threads made in the window, or -1 when the window was not reached.
    static func allocations(warmUp: Int, window: Int) throws -> Int {
        MallocInterposerSwift.initialize()
        CaptureThreads.prepare()
        MallocInterposerSwift.setAllocationHook(CaptureThreads.hook)
        defer { MallocInterposerSwift.setAllocationHook(nil) }
        let handler = NullHandler(warmUp: warmUp, window: window)
        // 30 fps and 10 ms periods: 130 buffers a second of media, produced as fast as the session takes them.
        let seconds = (warmUp + window) / 130 + 2
        let session = BroadcastSession(
            handler: handler,
            sources: [
                (.video, TestPatternSource(width: 320, height: 180, frameRate: (30, 1), realtime: false)),
                (.audioMic, ToneSource(realtime: false)),
            ],
            options: SessionOptions(duration: MediaTime(value: Int64(seconds), timescale: 1))
        )
        _ = try session.run()
        guard handler.counted else { return -1 }
        return CaptureThreads.allocations.load(ordering: .relaxed)
    }

    @Test func testSourcesThroughTheSessionAllocateNothingPerBuffer() async {
        await #expect(processExitsWith: .success, "allocations in 1000 buffers after the warm-up (exit status: the count, capped at 100)") {
            let count = try SteadyStateAllocationTests.allocations(warmUp: 300, window: 1000)
            exit(count < 0 ? 101 : Int32(min(count, 100)))
        }
    }
}
