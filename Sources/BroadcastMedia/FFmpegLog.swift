internal import CAVCodec
internal import CAVFormat
internal import CAVUtil
internal import CFFmpegShim
internal import CSwResample
internal import CSwScale
public import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// Routes FFmpeg's log (av_log, process-wide) into swift-log.
///
/// FFmpeg has one log callback for the whole process, so this is the application's choice, made
/// once at start-up: libraries never call it. Lines FFmpeg would print on stderr become log
/// records with metadata `ffmpeg.level`.
public enum FFmpegLog {
    /// Holds the logger the C callback reaches through its context pointer.
    private final class Target: Sendable {
        let logger: Logger
        let redact: @Sendable (String) -> String
        init(logger: Logger, redact: @escaping @Sendable (String) -> String) {
            self.logger = logger
            self.redact = redact
        }
    }

    /// Sends FFmpeg's log lines to `logger`, dropping those below `logger.logLevel` before FFmpeg
    /// formats them.
    ///
    /// The logger's box is deliberately never freed: FFmpeg threads may be inside the callback at
    /// any moment, and one small object per call is the price of never racing a free.
    ///
    /// `redact` rewrites every line before it is logged: FFmpeg's protocols print the URLs they
    /// open, and a stream URL carries its key.
    public static func install(_ logger: Logger, redact: @escaping @Sendable (String) -> String = { $0 }) {
        let target = Unmanaged.passRetained(Target(logger: logger, redact: redact)).toOpaque()
        CBroadcast_av_log_set_handler(
            { level, line, context in
                guard let line, let context else { return }
                let target = Unmanaged<Target>.fromOpaque(context).takeUnretainedValue()
                if level <= AV_LOG_ERROR, let collector = pthread_getspecific(FFmpegLog.collectorKey) {
                    Unmanaged<ErrorLines>.fromOpaque(collector).takeUnretainedValue().lines.append(target.redact(String(cString: line)))
                }
                target.logger.log(
                    level: FFmpegLog.loggerLevel(avLevel: level),
                    "\(target.redact(String(cString: line)))",
                    metadata: ["ffmpeg.level": "\(level)"]
                )
            },
            target,
            // Errors always reach the callback (`collectingErrors` needs them); the logger itself
            // drops what is below its level.
            max(avLevel(for: logger.logLevel), AV_LOG_ERROR)
        )
    }

    /// The error lines FFmpeg logged on one thread (see `collectingErrors`).
    private final class ErrorLines {
        var lines: [String] = []
    }

    /// Where the calling thread's `ErrorLines` is, while `collectingErrors` runs.
    private static let collectorKey: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "no thread-specific key left for FFmpeg's error lines")
        return key
    }()

    /// Runs `body` and returns its outcome with the error lines FFmpeg logged on this thread
    /// meanwhile (redacted like the log). FFmpeg says why a TLS handshake failed ("Peer
    /// certificate failed verification") only in its log; the error code is a plain EIO. Empty
    /// when the log is not installed.
    public static func collectingErrors<T, E: Error>(_ body: () throws(E) -> T) -> (Result<T, E>, [String]) {
        let collector = ErrorLines()
        let previous = pthread_getspecific(collectorKey)
        pthread_setspecific(collectorKey, Unmanaged.passUnretained(collector).toOpaque())
        defer { pthread_setspecific(collectorKey, previous) }
        let result: Result<T, E>
        do {
            result = .success(try body())
        } catch {
            result = .failure(error)
        }
        return withExtendedLifetime(collector) { (result, collector.lines) }
    }

    /// Puts FFmpeg's own stderr logging back.
    public static func uninstall() {
        CBroadcast_av_log_set_handler(nil, nil, AV_LOG_INFO)
    }

    /// AV_LOG_PANIC/FATAL → critical, ERROR → error, WARNING → warning, INFO, VERBOSE and
    /// DEBUG → debug, TRACE → trace. FFmpeg's INFO is per-encode statistics (x264's summary):
    /// detail for whoever debugs, noise in a service's info log.
    public static func loggerLevel(avLevel: Int32) -> Logger.Level {
        switch avLevel {
        case ...AV_LOG_FATAL: .critical
        case ...AV_LOG_ERROR: .error
        case ...AV_LOG_WARNING: .warning
        case ...AV_LOG_DEBUG: .debug
        default: .trace
        }
    }

    /// The most verbose AV_LOG level a logger at `level` still records.
    public static func avLevel(for level: Logger.Level) -> Int32 {
        switch level {
        case .trace: AV_LOG_TRACE
        case .debug: AV_LOG_DEBUG
        case .info, .notice, .warning: AV_LOG_WARNING
        case .error: AV_LOG_ERROR
        case .critical: AV_LOG_FATAL
        }
    }
}
