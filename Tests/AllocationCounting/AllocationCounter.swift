public import MallocInterposerSwift
import Synchronization

#if canImport(Glibc)
    public import Glibc
#elseif canImport(Musl)
    public import Musl
#endif

/// Counts the allocations some threads make while counting is on, with ordo-one's
/// malloc-interposer (linked into the test binary, so every malloc/calloc/realloc/posix_memalign of
/// the process goes through it). The tests that hold a path to "no allocation per buffer" share it:
/// `SteadyStateAllocationTests` (capture through the session) and `AudioPathAllocationTests`
/// (resample, mix, encode).
///
/// Which threads count: the one registered with `startCounting(on:)` and, when asked, every
/// thread named "bc-…" (the capture sources' own). What counts: everything but the Swift
/// runtime's own bookkeeping (a malloc from inside libswiftCore other than through
/// swift_slowAlloc, which every Swift object, array and string storage goes through: in a debug
/// build, unspecialised generic code, every `for x in array`, runs the collection's
/// `subscript.read` coroutine, whose frame the runtime mallocs; an optimised build specialises it
/// away). Swift objects and any C library's malloc count; those made inside FFmpeg's libraries
/// (libav*, libsw*: whoever asked for them) are counted apart, in `Counts.ffmpeg`.
///
/// One counting at a time, in a process of its own (an exit test), so no other test's threads
/// allocate in the window.
public enum AllocationCounter {
    public struct Counts: Sendable, Hashable {
        /// Allocations made other than inside FFmpeg's libraries.
        public var own: Int
        /// Allocations made inside FFmpeg's libraries.
        public var ffmpeg: Int
    }

    static let own = Atomic<Int>(0)
    static let ffmpeg = Atomic<Int>(0)
    /// The registered thread, once known.
    static let thread = Atomic<UInt>(0)
    static let countsCaptureThreads = Atomic<Bool>(false)

    /// Installs the counting hook (counting is off until `startCounting(on:)`). `captureThreads`:
    /// count the threads named "bc-…" too.
    public static func prepare(countingCaptureThreads captureThreads: Bool) {
        MallocInterposerSwift.initialize()
        countsCaptureThreads.store(captureThreads, ordering: .relaxed)
        // Touches the statics, so their one-time initialisation happens before counting.
        _ = own.load(ordering: .relaxed)
        _ = ffmpeg.load(ordering: .relaxed)
        _ = thread.load(ordering: .relaxed)
        _ = getName
        _ = isCounted()
        _ = classify()
        MallocInterposerSwift.setAllocationHook(hook)
    }

    /// Starts a counting window (from zero) for `thread` (and the capture threads, if asked).
    public static func startCounting(on counted: pthread_t = pthread_self()) {
        thread.store(UInt(counted), ordering: .relaxed)
        own.store(0, ordering: .relaxed)
        ffmpeg.store(0, ordering: .relaxed)
        MallocInterposerSwift.hook()
    }

    /// Ends the window: what was counted in it.
    @discardableResult
    public static func stopCounting() -> Counts {
        MallocInterposerSwift.unhook()
        return counts
    }

    /// What the last window counted (so far, while one is open).
    public static var counts: Counts {
        Counts(own: own.load(ordering: .relaxed), ffmpeg: ffmpeg.load(ordering: .relaxed))
    }

    /// Removes the hook.
    public static func finish() {
        MallocInterposerSwift.unhook()
        MallocInterposerSwift.setAllocationHook(nil)
    }

    /// pthread_getname_np (a GNU function Glibc's Swift module leaves out); for the calling
    /// thread it is a prctl, no allocation.
    typealias GetName = @convention(c) (pthread_t, UnsafeMutablePointer<CChar>, Int) -> Int32
    static let getName: GetName = unsafeBitCast(dlsym(nil, "pthread_getname_np")!, to: GetName.self)

    static func isCounted() -> Bool {
        let me = pthread_self()
        if UInt(me) == thread.load(ordering: .relaxed) { return true }
        guard countsCaptureThreads.load(ordering: .relaxed) else { return false }
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

    enum Kind { case runtimeBookkeeping, own, ffmpeg }

    /// Whose allocation this is, by its caller (the first frame outside the interposer).
    static func classify() -> Kind {
        // On the stack: the hook's own frames, the interposer's, then the allocation's caller.
        withUnsafeTemporaryAllocation(of: UnsafeMutableRawPointer?.self, capacity: 32) { buffer -> Kind in
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
                if contains(file, "/libav") || contains(file, "/libswresample") || contains(file, "/libswscale") {
                    return .ffmpeg
                }
                guard contains(file, "libswiftCore") else { return .own }
                guard let symbol = info.2 else { return .runtimeBookkeeping }
                return strcmp(symbol.assumingMemoryBound(to: CChar.self), cString("swift_slowAlloc")) == 0
                    ? .own : .runtimeBookkeeping
            }
            return .own
        }
    }

    /// A literal as a C string without converting a String (which would allocate, in the allocator).
    static func cString(_ s: StaticString) -> UnsafePointer<CChar> {
        UnsafeRawPointer(s.utf8Start).assumingMemoryBound(to: CChar.self)
    }

    static func contains(_ text: UnsafePointer<CChar>, _ part: StaticString) -> Bool { strstr(text, cString(part)) != nil }

    static let hook: MallocInterposerSwift.AllocationHook = { _ in
        guard isCounted() else { return }
        switch classify() {
        case .runtimeBookkeeping: break
        case .own: own.add(1, ordering: .relaxed)
        case .ffmpeg: ffmpeg.add(1, ordering: .relaxed)
        }
    }
}
