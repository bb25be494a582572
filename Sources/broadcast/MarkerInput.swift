import BroadcastKit
import BroadcastDaemon
import BroadcastOutputs
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// `record` (and `stream --record`): each line typed on the terminal (standard input a terminal, or a pipe or FIFO) puts a
/// marker into the recording, titled by the line (an empty line: "Marker N"). A file or /dev/null
/// as standard input is never read.
enum MarkerInput {
    static func start(outputs: [Output], logger: Logger) {
        var info = stat()
        guard !outputs.isEmpty, isatty(0) != 0 || (fstat(0, &info) == 0 && (info.st_mode & S_IFMT == S_IFIFO || info.st_mode & S_IFMT == S_IFSOCK)) else {
            return
        }
        // Never joined: it reads until standard input ends, or the process does.
        _ = OSThread(name: "bc-markers") {
            var number = 0
            while let line = readLine(strippingNewline: true) {
                let text = line.hasSuffix("\r") ? String(line.dropLast()) : line
                let title = text.trimmed { $0 == " " || $0 == "\t" }.isEmpty ? nil : text
                do throws(BroadcastError) {
                    let mark = try Output.mark(outputs, title: title, number: number + 1)
                    number += 1
                    logger.notice("marker \(mark.number) \"\(mark.title)\" at \(MediaClockText.format(mark.media)) of media")
                } catch {
                    logger.error("no marker: \(error.message)")
                }
            }
        }
    }
}
