public import BroadcastKit
internal import CSystemd

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A client of the xdg-desktop-portal ScreenCast API (org.freedesktop.portal.ScreenCast) over the
/// session bus, through sd-bus (see docs/DESIGN.md, "Wayland capture", for why sd-bus).
///
/// CreateSession → SelectSources → Start → OpenPipeWireRemote. Each of the first three answers
/// with a Request object whose `Response` signal carries the result; the request's object path
/// is known in advance from our unique bus name and the `handle_token` we pass, so the signal
/// is subscribed to before the call and cannot be missed. The portal session lives as long as this
/// object's bus connection (or until `close`); the compositor ending it is seen by `poll`.
///
/// Used by one thread at a time.
public final class ScreenCastPortal: @unchecked Sendable {
    public enum SourceKind: UInt32, Sendable {
        case monitor = 1
        case window = 2
    }

    public enum CursorMode: UInt32, Sendable, CaseIterable {
        case hidden = 1
        case embedded = 2
        case metadata = 4

        public var name: String {
            switch self {
            case .hidden: "hidden"
            case .embedded: "embedded"
            case .metadata: "metadata"
            }
        }
    }

    /// What Start gave: the PipeWire node to link to, its size, and the token for next time.
    public struct Cast: Sendable {
        public var nodeID: UInt32
        public var width: Int?
        public var height: Int?
        public var restoreToken: String?
    }

    static let destination = "org.freedesktop.portal.Desktop"
    static let objectPath = "/org/freedesktop/portal/desktop"
    static let interface = "org.freedesktop.portal.ScreenCast"

    private var bus: OpaquePointer?
    private var sessionHandle: String?
    private var closedSlot: OpaquePointer?
    private let closedFlag = Flag()
    private var tokenCounter = 0

    /// Connects to the session bus ($DBUS_SESSION_BUS_ADDRESS).
    public init() throws(BroadcastError) {
        var bus: OpaquePointer?
        let r = sd_bus_open_user(&bus)
        guard r >= 0, let bus else {
            let address = getenv("DBUS_SESSION_BUS_ADDRESS").map { String(cString: $0) } ?? "(DBUS_SESSION_BUS_ADDRESS unset)"
            throw BroadcastError(.sourceFailed, "ScreenCast portal: cannot reach the session bus at \(address): \(Self.errnoText(r))")
        }
        self.bus = bus
    }

    deinit { close() }

    /// Ends the portal session (the compositor stops the cast) and drops the bus connection.
    public func close() {
        if let bus, let handle = sessionHandle {
            var error = sd_bus_error()
            var reply: OpaquePointer?
            var message: OpaquePointer?
            if sd_bus_message_new_method_call(bus, &message, Self.destination, handle, "org.freedesktop.portal.Session", "Close") >= 0 {
                _ = sd_bus_call(bus, message, 1_000_000, &error, &reply)
                sd_bus_message_unref(reply)
                sd_bus_message_unref(message)
            }
            sd_bus_error_free(&error)
        }
        sessionHandle = nil
        if let closedSlot { sd_bus_slot_unref(closedSlot) }
        closedSlot = nil
        if let bus { sd_bus_flush_close_unref(bus) }
        bus = nil
    }

    /// The portal's ScreenCast `version` property, nil when no portal answers.
    public func version() -> UInt32? { property("version") }

    /// The cursor modes the portal offers (AvailableCursorModes), nil when it does not say.
    public func availableCursorModes() -> [CursorMode]? {
        guard let mask: UInt32 = property("AvailableCursorModes") else { return nil }
        return CursorMode.allCases.filter { mask & $0.rawValue != 0 }
    }

    private func property(_ name: String) -> UInt32? {
        guard let bus else { return nil }
        var error = sd_bus_error()
        defer { sd_bus_error_free(&error) }
        var value: UInt32 = 0
        let r = sd_bus_get_property_trivial(bus, Self.destination, Self.objectPath, Self.interface, name, &error, Self.type("u"), &value)
        return r >= 0 ? value : nil
    }

    /// Asks for a cast and waits for the answers. `restoreToken` (from the last Start) lets the
    /// portal reuse the earlier choice without asking; an unknown or stale token makes it ask again.
    /// Throws a one-line error when the portal is absent, refuses, or the person cancels.
    public func start(
        kind: SourceKind, cursor: CursorMode, restoreToken: String?, timeoutSeconds: Int = 300
    ) throws(BroadcastError) -> Cast {
        guard let version = version() else {
            throw BroadcastError(
                .sourceFailed,
                "ScreenCast portal: no xdg-desktop-portal with ScreenCast answers on the session bus (is xdg-desktop-portal and a backend such as xdg-desktop-portal-wlr, -gnome or -kde running?)"
            )
        }
        if let types: UInt32 = property("AvailableSourceTypes"), types & kind.rawValue == 0 {
            let offered = [(1, "monitor"), (2, "window"), (4, "virtual")].filter { types & UInt32($0.0) != 0 }.map(\.1)
            throw BroadcastError(
                .sourceFailed,
                "ScreenCast portal: casting a \(kind == .window ? "window" : "monitor") is not offered (the portal offers \(offered.isEmpty ? "nothing" : offered.joined(separator: ", ")))"
            )
        }
        if let modes = availableCursorModes(), !modes.contains(cursor) {
            throw BroadcastError(
                .sourceFailed,
                "ScreenCast portal: cursor=\(cursor.name) is not offered (the portal offers \(modes.map(\.name).joined(separator: ", ")))"
            )
        }
        // CreateSession
        var results = try request("CreateSession", timeoutSeconds: 30) { (message: OpaquePointer?, token: String) throws(BroadcastError) in
            try Self.check(sd_bus_message_open_container(message, Self.type("a"), "{sv}"))
            try Self.appendEntry(message, "handle_token", string: token)
            try Self.appendEntry(message, "session_handle_token", string: token)
            try Self.check(sd_bus_message_close_container(message))
        }
        guard case .string(let handle)? = results["session_handle"] else {
            throw BroadcastError(.sourceFailed, "ScreenCast portal: CreateSession answered without a session handle")
        }
        sessionHandle = handle
        watchClosed(handle)

        // SelectSources
        results = try request("SelectSources", timeoutSeconds: 30) { (message: OpaquePointer?, token: String) throws(BroadcastError) in
            try Self.check(sd_bus_message_append_basic(message, Self.type("o"), handle))
            try Self.check(sd_bus_message_open_container(message, Self.type("a"), "{sv}"))
            try Self.appendEntry(message, "handle_token", string: token)
            try Self.appendEntry(message, "types", uint32: kind.rawValue)
            try Self.appendEntry(message, "multiple", bool: false)
            if version >= 2 { try Self.appendEntry(message, "cursor_mode", uint32: cursor.rawValue) }
            if version >= 4 {
                try Self.appendEntry(message, "persist_mode", uint32: 2)
                if let restoreToken, !restoreToken.isEmpty { try Self.appendEntry(message, "restore_token", string: restoreToken) }
            }
            try Self.check(sd_bus_message_close_container(message))
        }

        // Start (where a chooser or a permission dialog appears)
        results = try request("Start", timeoutSeconds: timeoutSeconds) { (message: OpaquePointer?, token: String) throws(BroadcastError) in
            try Self.check(sd_bus_message_append_basic(message, Self.type("o"), handle))
            try Self.check(sd_bus_message_append_basic(message, Self.type("s"), ""))
            try Self.check(sd_bus_message_open_container(message, Self.type("a"), "{sv}"))
            try Self.appendEntry(message, "handle_token", string: token)
            try Self.check(sd_bus_message_close_container(message))
        }
        guard case .streams(let streams)? = results["streams"], let first = streams.first else {
            throw BroadcastError(.sourceFailed, "ScreenCast portal: Start answered without a stream")
        }
        var token: String?
        if case .string(let t)? = results["restore_token"] { token = t }
        return Cast(nodeID: first.node, width: first.width, height: first.height, restoreToken: token)
    }

    /// The PipeWire remote for this session (a new descriptor the caller owns).
    public func openPipeWireRemote() throws(BroadcastError) -> Int32 {
        guard let handle = sessionHandle else {
            throw BroadcastError(.sourceFailed, "ScreenCast portal: no session")
        }
        return try call("OpenPipeWireRemote", timeoutMicroseconds: 10_000_000) { (message) throws(BroadcastError) in
            try Self.check(sd_bus_message_append_basic(message, Self.type("o"), handle))
            try Self.check(sd_bus_message_open_container(message, Self.type("a"), "{sv}"))
            try Self.check(sd_bus_message_close_container(message))
        } read: { (reply) throws(BroadcastError) -> Int32 in
            // The reply owns the descriptor it carries and closes it when freed: keep a copy first.
            var fd: Int32 = -1
            try Self.check(sd_bus_message_read_basic(reply, Self.type("h"), &fd))
            let own = fcntl(fd, F_DUPFD_CLOEXEC, 3)
            guard own >= 0 else { throw BroadcastError(.sourceFailed, "ScreenCast portal: cannot keep the PipeWire descriptor: \(Self.errnoText(-errno))") }
            return own
        }
    }

    /// Handles what arrived on the bus without waiting; false once the portal closed the session.
    public func poll() -> Bool {
        guard let bus else { return false }
        while sd_bus_process(bus, nil) > 0 {}
        return !closedFlag.value
    }

    // MARK: Requests

    enum Value {
        case string(String)
        case uint32(UInt32)
        case streams([(node: UInt32, width: Int?, height: Int?)])
    }

    final class Flag { var value = false }

    private final class Pending {
        var message: OpaquePointer?
    }

    private func nextToken() -> String {
        tokenCounter += 1
        return "broadcast_\(getpid())_\(tokenCounter)"
    }

    /// Calls `method` with a fresh handle_token, waits for its Request's Response, and returns the
    /// result dictionary; throws on an error reply, a non-zero response or a timeout.
    private func request(
        _ method: String, timeoutSeconds: Int,
        arguments: (OpaquePointer?, String) throws(BroadcastError) -> Void
    ) throws(BroadcastError) -> [String: Value] {
        guard let bus else { throw BroadcastError(.sourceFailed, "ScreenCast portal: no bus") }
        var uniqueName: UnsafePointer<CChar>?
        try Self.check(sd_bus_get_unique_name(bus, &uniqueName))
        let sender = String(cString: uniqueName!).dropFirst().replacingOccurrences(".", with: "_")
        let token = nextToken()
        let requestPath = "/org/freedesktop/portal/desktop/request/\(sender)/\(token)"
        let pending = Pending()
        let context = Unmanaged.passRetained(pending)
        defer { context.release() }
        var slot: OpaquePointer?
        try Self.check(
            sd_bus_match_signal(bus, &slot, nil, requestPath, "org.freedesktop.portal.Request", "Response", { message, userdata, _ in
                let pending = Unmanaged<Pending>.fromOpaque(userdata!).takeUnretainedValue()
                if pending.message == nil { pending.message = sd_bus_message_ref(message) }
                return 0
            }, context.toOpaque()))
        defer {
            sd_bus_slot_unref(slot)
            sd_bus_message_unref(pending.message)
        }

        try call(method, timeoutMicroseconds: 30_000_000) { (message) throws(BroadcastError) in
            try arguments(message, token)
        } read: { _ in }
        let deadline = MonotonicClock().now() + Int64(timeoutSeconds) * 1_000_000_000
        while pending.message == nil {
            let p = sd_bus_process(bus, nil)
            if p < 0 { throw BroadcastError(.sourceFailed, "ScreenCast portal: the session bus connection failed: \(Self.errnoText(p))") }
            if p > 0 { continue }
            let left = deadline - MonotonicClock().now()
            if left <= 0 {
                throw BroadcastError(.sourceFailed, "ScreenCast portal: no answer to \(method) within \(timeoutSeconds) s")
            }
            _ = sd_bus_wait(bus, UInt64(min(left, 500_000_000) / 1000))
        }
        let response = pending.message
        var code: UInt32 = 0
        try Self.check(sd_bus_message_read_basic(response, Self.type("u"), &code))
        switch code {
        case 0: break
        case 1: throw BroadcastError(.sourceFailed, "ScreenCast portal: \(method) was cancelled (the screen-sharing request was declined)")
        default: throw BroadcastError(.sourceFailed, "ScreenCast portal: \(method) was refused by the portal (response \(code); see the portal's log)")
        }
        return try Self.readResults(response)
    }

    /// Calls a ScreenCast method on the portal and hands its reply to `read` (both messages are
    /// freed after); an error reply or no reply within the timeout throws, naming the method.
    private func call<Result>(
        _ method: String, timeoutMicroseconds: UInt64,
        arguments: (OpaquePointer?) throws(BroadcastError) -> Void,
        read: (OpaquePointer?) throws(BroadcastError) -> Result
    ) throws(BroadcastError) -> Result {
        guard let bus else { throw BroadcastError(.sourceFailed, "ScreenCast portal: no bus") }
        var message: OpaquePointer?
        var reply: OpaquePointer?
        var error = sd_bus_error()
        defer {
            sd_bus_error_free(&error)
            sd_bus_message_unref(message)
            sd_bus_message_unref(reply)
        }
        try Self.check(sd_bus_message_new_method_call(bus, &message, Self.destination, Self.objectPath, Self.interface, method))
        try arguments(message)
        let r = sd_bus_call(bus, message, timeoutMicroseconds, &error, &reply)
        guard r >= 0 else {
            throw BroadcastError(.sourceFailed, "ScreenCast portal: \(method) failed: \(Self.text(error, r))")
        }
        return try read(reply)
    }

    private func watchClosed(_ handle: String) {
        guard let bus else { return }
        let flag = Unmanaged.passUnretained(closedFlag).toOpaque()
        _ = sd_bus_match_signal(bus, &closedSlot, nil, handle, "org.freedesktop.portal.Session", "Closed", { _, userdata, _ in
            Unmanaged<Flag>.fromOpaque(userdata!).takeUnretainedValue().value = true
            return 0
        }, flag)
    }

    // MARK: Message helpers

    static func type(_ c: Unicode.Scalar) -> CChar { CChar(UInt8(ascii: c)) }

    static func check(_ r: Int32) throws(BroadcastError) {
        if r < 0 { throw BroadcastError(.sourceFailed, "ScreenCast portal: D-Bus message error: \(errnoText(r))") }
    }

    static func errnoText(_ r: Int32) -> String { String(cString: strerror(-r)) }

    static func text(_ error: sd_bus_error, _ r: Int32) -> String {
        if let message = error.message { return String(cString: message) + (error.name.map { " (\(String(cString: $0)))" } ?? "") }
        if let name = error.name { return String(cString: name) }
        return errnoText(r)
    }

    static func appendEntry(_ m: OpaquePointer?, _ key: String, string: String) throws(BroadcastError) {
        try check(sd_bus_message_open_container(m, type("e"), "sv"))
        try check(sd_bus_message_append_basic(m, type("s"), key))
        try check(sd_bus_message_open_container(m, type("v"), "s"))
        try check(sd_bus_message_append_basic(m, type("s"), string))
        try check(sd_bus_message_close_container(m))
        try check(sd_bus_message_close_container(m))
    }

    static func appendEntry(_ m: OpaquePointer?, _ key: String, uint32: UInt32) throws(BroadcastError) {
        var value = uint32
        try check(sd_bus_message_open_container(m, type("e"), "sv"))
        try check(sd_bus_message_append_basic(m, type("s"), key))
        try check(sd_bus_message_open_container(m, type("v"), "u"))
        try check(sd_bus_message_append_basic(m, type("u"), &value))
        try check(sd_bus_message_close_container(m))
        try check(sd_bus_message_close_container(m))
    }

    static func appendEntry(_ m: OpaquePointer?, _ key: String, bool: Bool) throws(BroadcastError) {
        var value: Int32 = bool ? 1 : 0
        try check(sd_bus_message_open_container(m, type("e"), "sv"))
        try check(sd_bus_message_append_basic(m, type("s"), key))
        try check(sd_bus_message_open_container(m, type("v"), "b"))
        try check(sd_bus_message_append_basic(m, type("b"), &value))
        try check(sd_bus_message_close_container(m))
        try check(sd_bus_message_close_container(m))
    }

    static func readString(_ m: OpaquePointer?, _ t: Unicode.Scalar = "s") throws(BroadcastError) -> String {
        var p: UnsafePointer<CChar>?
        try check(sd_bus_message_read_basic(m, type(t), &p))
        return p.map { String(cString: $0) } ?? ""
    }

    /// An a{sv} of results: strings, object paths, uint32s and the `streams` list; others skipped.
    static func readResults(_ m: OpaquePointer?) throws(BroadcastError) -> [String: Value] {
        var out: [String: Value] = [:]
        try check(sd_bus_message_enter_container(m, type("a"), "{sv}"))
        while try enter(m, "e", "sv") {
            let key = try readString(m)
            var t: CChar = 0
            var contents: UnsafePointer<CChar>?
            try check(sd_bus_message_peek_type(m, &t, &contents))
            let signature = contents.map { String(cString: $0) } ?? ""
            switch signature {
            case "s", "o":
                try check(sd_bus_message_enter_container(m, type("v"), signature))
                out[key] = .string(try readString(m, signature == "s" ? "s" : "o"))
                try check(sd_bus_message_exit_container(m))
            case "u":
                try check(sd_bus_message_enter_container(m, type("v"), "u"))
                var value: UInt32 = 0
                try check(sd_bus_message_read_basic(m, type("u"), &value))
                out[key] = .uint32(value)
                try check(sd_bus_message_exit_container(m))
            case "a(ua{sv})":
                try check(sd_bus_message_enter_container(m, type("v"), signature))
                out[key] = .streams(try readStreams(m))
                try check(sd_bus_message_exit_container(m))
            default:
                try check(sd_bus_message_skip(m, "v"))
            }
            try check(sd_bus_message_exit_container(m))
        }
        try check(sd_bus_message_exit_container(m))
        return out
    }

    private static func enter(_ m: OpaquePointer?, _ t: Unicode.Scalar, _ contents: String) throws(BroadcastError) -> Bool {
        let r = sd_bus_message_enter_container(m, type(t), contents)
        try check(r)
        return r > 0
    }

    private static func readStreams(_ m: OpaquePointer?) throws(BroadcastError) -> [(node: UInt32, width: Int?, height: Int?)] {
        var streams: [(node: UInt32, width: Int?, height: Int?)] = []
        try check(sd_bus_message_enter_container(m, type("a"), "(ua{sv})"))
        while try enter(m, "r", "ua{sv}") {
            var node: UInt32 = 0
            try check(sd_bus_message_read_basic(m, type("u"), &node))
            var width: Int?
            var height: Int?
            try check(sd_bus_message_enter_container(m, type("a"), "{sv}"))
            while try enter(m, "e", "sv") {
                let key = try readString(m)
                if key == "size" {
                    try check(sd_bus_message_enter_container(m, type("v"), "(ii)"))
                    try check(sd_bus_message_enter_container(m, type("r"), "ii"))
                    var w: Int32 = 0
                    var h: Int32 = 0
                    try check(sd_bus_message_read_basic(m, type("i"), &w))
                    try check(sd_bus_message_read_basic(m, type("i"), &h))
                    width = Int(w)
                    height = Int(h)
                    try check(sd_bus_message_exit_container(m))
                    try check(sd_bus_message_exit_container(m))
                } else {
                    try check(sd_bus_message_skip(m, "v"))
                }
                try check(sd_bus_message_exit_container(m))
            }
            try check(sd_bus_message_exit_container(m))
            try check(sd_bus_message_exit_container(m))
            streams.append((node, width, height))
        }
        try check(sd_bus_message_exit_container(m))
        return streams
    }
}

extension Substring {
    fileprivate func replacingOccurrences(_ a: Character, with b: Character) -> String {
        String(map { $0 == a ? b : $0 })
    }
}
