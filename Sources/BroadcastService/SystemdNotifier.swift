public import Logging

#if canImport(Glibc)
import Glibc
#endif

/// The sd_notify protocol spoken directly: one datagram per message on the socket named by
/// $NOTIFY_SOCKET (a path, or an abstract name starting with '@'). Without $NOTIFY_SOCKET every call
/// does nothing, so the daemon runs the same outside systemd.
public struct SystemdNotifier: Sendable {
    public let socketPath: String?
    /// The watchdog interval systemd asked for ($WATCHDOG_USEC), in nanoseconds.
    public let watchdogNanoseconds: Int64?

    public init(environment: [String: String]) {
        socketPath = environment["NOTIFY_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
        if let usec = environment["WATCHDOG_USEC"].flatMap(Int64.init), usec > 0,
            environment["WATCHDOG_PID"].flatMap(Int32.init).map({ $0 == getpid() }) ?? true
        {
            watchdogNanoseconds = usec * 1000
        } else {
            watchdogNanoseconds = nil
        }
    }

    public static func fromProcessEnvironment() -> SystemdNotifier {
        var environment: [String: String] = [:]
        for name in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] {
            if let value = getenv(name) { environment[name] = String(cString: value) }
        }
        return SystemdNotifier(environment: environment)
    }

    public var isActive: Bool { socketPath != nil }

    public func ready(status: String) { send("READY=1\nSTATUS=\(status)") }
    public func status(_ text: String) { send("STATUS=\(text)") }
    public func watchdog() { send("WATCHDOG=1") }
    public func stopping(status: String) { send("STOPPING=1\nSTATUS=\(status)") }
    public func reloading() { send("RELOADING=1") }

    /// Sends one notification; failures are ignored (systemd may be gone during shutdown).
    @discardableResult
    public func send(_ message: String) -> Bool {
        guard let socketPath else { return false }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var path = Array(socketPath.utf8)
        let abstract = path.first == UInt8(ascii: "@")
        if abstract { path[0] = 0 }
        guard path.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: path)
            if !abstract { raw[path.count] = 0 }
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + path.count + (abstract ? 0 : 1))
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        let bytes = Array(message.utf8)
        let sent = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { addr in
                bytes.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), addr, length) }
            }
        }
        return sent == bytes.count
    }
}
