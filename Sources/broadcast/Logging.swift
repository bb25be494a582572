import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Log lines on standard error. Under systemd (JOURNAL_STREAM set) each line starts with its
/// syslog priority (`<3>`) and carries no timestamp: the journal adds both fields itself.
struct StandardErrorLogHandler: LogHandler {
    var logLevel: Logger.Level
    var metadata: Logger.Metadata = [:]
    let label: String
    let journal = getenv("JOURNAL_STREAM") != nil

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var all = metadata
        if let extra = event.metadata { all.merge(extra) { $1 } }
        let tail = all.isEmpty ? "" : " " + all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        if journal {
            FileStandardError.write("<\(Self.priority(event.level))>\(event.message)\(tail)\n")
        } else {
            FileStandardError.write("\(Self.timestamp()) \(event.level) \(label): \(event.message)\(tail)\n")
        }
    }

    static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        case .critical: 2
        }
    }

    static func timestamp() -> String {
        var now = time(nil)
        var parts = tm()
        localtime_r(&now, &parts)
        var buffer = [CChar](repeating: 0, count: 32)
        let n = strftime(&buffer, buffer.count, "%H:%M:%S", &parts)
        return String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

enum Logging {
    /// Sends every logger in the process to standard error at `level`; returns the command's logger.
    static func bootstrap(level: Logger.Level) -> Logger {
        LoggingSystem.bootstrap { label in StandardErrorLogHandler(logLevel: level, label: label) }
        var logger = Logger(label: "broadcast")
        logger.logLevel = level
        return logger
    }
}
