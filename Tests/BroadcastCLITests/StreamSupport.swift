import Foundation
import Synchronization
import Testing

/// A free TCP port on 127.0.0.1 (bound to port 0, read back, released).
func freePort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
    }
    guard bound == 0 else { throw ProbeError(message: "bind failed: errno \(errno)") }
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// A TCP connection to 127.0.0.1:`port`, or -1.
func connectLocal(_ port: Int) -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = UInt16(port).bigEndian
    let rc = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    if rc != 0 {
        close(fd)
        return -1
    }
    return fd
}

/// A real nginx with libnginx-mod-rtmp on 127.0.0.1: config in a temp dir, `record all` into it,
/// one process (no daemon, no master), stopped by its PID.
final class RTMPServer {
    let directory: TemporaryDirectory
    let port: Int
    private(set) var child: Child?
    var recordDirectory: String { directory.path("rec") }
    var pidFile: String { directory.path("nginx.pid") }

    /// With `tls`: also RTMPS on `tlsPort`, nginx's stream module ending TLS in front of the RTMP
    /// port, with a certificate for `certificateName` (a subjectAltName) signed by a private CA made
    /// here with openssl (`caFile`: trusted by no system store).
    private(set) var tlsPort: Int?
    var caFile: String { directory.path("ca.pem") }

    init(tls: Bool = false, certificateName: String = "IP:127.0.0.1") throws {
        directory = try TemporaryDirectory()
        port = try freePort()
        try FileManager.default.createDirectory(atPath: directory.path("rec"), withIntermediateDirectories: true)
        var tlsBlock = ""
        var streamModule = ""
        if tls {
            let tlsPort = try freePort()
            self.tlsPort = tlsPort
            try "subjectAltName=\(certificateName)\n".write(toFile: directory.path("san.cnf"), atomically: true, encoding: .utf8)
            for arguments in [
                ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=broadcast test CA",
                 "-keyout", directory.path("ca-key.pem"), "-out", caFile],
                ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=broadcast test server",
                 "-keyout", directory.path("key.pem"), "-out", directory.path("cert.csr")],
                ["x509", "-req", "-in", directory.path("cert.csr"), "-CA", caFile, "-CAkey", directory.path("ca-key.pem"),
                 "-CAcreateserial", "-days", "1", "-extfile", directory.path("san.cnf"), "-out", directory.path("cert.pem")],
            ] {
                let made = try run("/usr/bin/openssl", arguments)
                guard made.status == 0 else { throw ProbeError(message: "openssl \(arguments[0]): \(made.stderr)") }
            }
            streamModule = "load_module /usr/lib/nginx/modules/ngx_stream_module.so;"
            tlsBlock = """
                stream {
                    server {
                        listen 127.0.0.1:\(tlsPort) ssl;
                        ssl_certificate \(directory.path("cert.pem"));
                        ssl_certificate_key \(directory.path("key.pem"));
                        proxy_pass 127.0.0.1:\(port);
                    }
                }
                """
        }
        let config = """
            load_module /usr/lib/nginx/modules/ngx_rtmp_module.so;
            \(streamModule)
            daemon off;
            master_process off;
            pid \(pidFile);
            error_log \(directory.path("error.log")) info;
            events { worker_connections 64; }
            rtmp {
                server {
                    listen 127.0.0.1:\(port);
                    application live { live on; record all; record_path \(recordDirectory); record_unique on; }
                    application locked { live on; deny publish all; }
                }
            }
            \(tlsBlock)
            """
        try config.write(toFile: directory.path("nginx.conf"), atomically: true, encoding: .utf8)
        try start()
    }

    /// Starts nginx and waits until it accepts connections.
    func start() throws {
        child = try Child(
            "/usr/sbin/nginx",
            ["-c", directory.path("nginx.conf"), "-p", directory.url.path, "-e", directory.path("error.log")])
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            let fd = connectLocal(port)
            if fd >= 0 {
                close(fd)
                return
            }
            usleep(20_000)
        }
        throw ProbeError(message: "nginx did not start: \((try? String(contentsOfFile: directory.path("error.log"), encoding: .utf8)) ?? "")")
    }

    /// Stops nginx by the PID in its pid file (`signal`: SIGKILL for a crash, SIGQUIT for a clean stop).
    func stop(signal: Int32 = SIGQUIT) {
        let text = (try? String(contentsOfFile: pidFile, encoding: .utf8)) ?? ""
        if let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)) {
            kill(pid, signal)
        } else if let child {
            kill(child.process.processIdentifier, signal)
        }
        _ = child?.wait(timeout: 10)
        child = nil
    }

    /// The files nginx recorded, oldest first.
    var recordings: [String] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: recordDirectory)) ?? []
        return names.filter { $0.hasSuffix(".flv") }.map { "\(recordDirectory)/\($0)" }.sorted {
            let a = (try? FileManager.default.attributesOfItem(atPath: $0)[.creationDate] as? Date) ?? nil
            let b = (try? FileManager.default.attributesOfItem(atPath: $1)[.creationDate] as? Date) ?? nil
            return (a ?? .distantPast, $0) < (b ?? .distantPast, $1)
        }
    }

    func cleanup() {
        stop()
        directory.cleanup()
    }
}

/// A TCP proxy of the test's own on 127.0.0.1 that forwards to `target`, reading from the client at
/// most `bytesPerSecond` (a slow uplink). Server-to-client traffic goes through unthrottled.
final class ThrottlingProxy: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private let target: Int
    private let initialRate: Int
    /// The rate the client-to-server direction is held to now; changed by `setRate` (a dip).
    private let rate: Mutex<Int>
    private var running = true

    init(target: Int, bytesPerSecond: Int) throws {
        self.target = target
        initialRate = bytesPerSecond
        rate = Mutex(bytesPerSecond)
        port = try freePort()
        listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        // A small receive buffer (inherited by accepted sockets) so the slowness reaches the sender.
        var small: Int32 = 16 * 1024
        setsockopt(listener, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0, listen(listener, 4) == 0 else { throw ProbeError(message: "proxy: bind/listen failed: errno \(errno)") }
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    private func acceptLoop() {
        while running {
            let client = accept(listener, nil, nil)
            if client < 0 { return }
            let server = connectLocal(target)
            if server < 0 {
                close(client)
                continue
            }
            Thread.detachNewThread { [self] in pump(from: client, to: server, throttled: true) }
            Thread.detachNewThread { [self] in pump(from: server, to: client, throttled: false) }
        }
    }

    /// From now on the path takes `bytesPerSecond` (a token bucket: each chunk waits for its bytes
    /// at the rate in force when it was read).
    func setRate(_ bytesPerSecond: Int) { rate.withLock { $0 = bytesPerSecond } }

    private func pump(from source: Int32, to destination: Int32, throttled: Bool) {
        let chunk = throttled ? max(512, initialRate / 20) : 64 * 1024
        var buffer = [UInt8](repeating: 0, count: chunk)
        var due = Date()
        while true {
            let n = read(source, &buffer, chunk)
            if n <= 0 { break }
            var offset = 0
            while offset < n {
                let w = buffer.withUnsafeBytes { write(destination, $0.baseAddress! + offset, n - offset) }
                if w <= 0 { break }
                offset += w
            }
            if throttled {
                // Sleep until these bytes fit the rate (never banking more than a moment of idle time).
                let now = Date()
                if due < now.addingTimeInterval(-0.05) { due = now.addingTimeInterval(-0.05) }
                due = due.addingTimeInterval(Double(n) / Double(rate.withLock { $0 }))
                let wait = due.timeIntervalSince(Date())
                if wait > 0 { usleep(useconds_t(wait * 1e6)) }
            }
        }
        shutdown(destination, Int32(SHUT_WR))
        shutdown(source, Int32(SHUT_RD))
    }

    func stop() {
        running = false
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }
}

/// The per-output summary line `broadcast stream` prints at the end, for `target` (a prefix).
func outputSummary(_ stderr: String, target: String) -> String? {
    stderr.split(separator: "\n").map(String.init).last { $0.hasPrefix("broadcast: \(target)") }
}

/// "drops=backlog-ref:12,keyframe-wait:40" → [backlog-ref: 12, keyframe-wait: 40]
func dropCounts(_ summary: String) -> [String: Int] {
    guard let range = summary.range(of: "drops=") else { return [:] }
    let list = summary[range.upperBound...].prefix { $0 != ";" && $0 != " " }
    var counts: [String: Int] = [:]
    for item in list.split(separator: ",") {
        let parts = item.split(separator: ":")
        if parts.count == 2, let n = Int(parts[1]) { counts[String(parts[0])] = n }
    }
    return counts
}

/// "max-backlog=149ms" → 149
func maxBacklog(_ summary: String) -> Int? {
    guard let range = summary.range(of: "max-backlog=") else { return nil }
    return Int(summary[range.upperBound...].prefix { $0.isNumber })
}
