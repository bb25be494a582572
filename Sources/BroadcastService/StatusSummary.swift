/// `broadcast status` for people: the daemon's status document (`GET /v1/status`) as a short
/// summary in the spirit of `systemctl status`: the broadcast, memory, each source and each output
/// with its figures in units people read, the last error. Pure: a document and a width in, lines
/// out, so every state, long name and narrow terminal is tested on fixed documents.
public struct StatusSummary: Sendable {
    /// The terminal's width in columns; no line is longer (long targets and errors are shortened
    /// in the middle, where a path or URL says least).
    public var width: Int

    public init(width: Int = 80) { self.width = max(width, 40) }

    public func render(_ status: JSONValue, events: [String] = []) -> String {
        var lines: [String] = []
        let state = status["state"]?.stringValue ?? "?"
        var head = "broadcast: \(state)"
        if state != "idle" {
            var figures: [String] = []
            if let up = status["uptime_seconds"]?.numberValue { figures.append("up \(Self.clock(up))") }
            if let media = status["media_seconds"]?.numberValue { figures.append("media \(Self.clock(media))") }
            if let fps = status["fps"]?.numberValue { figures.append("\(Self.decimal(fps, 1)) fps") }
            if let bitrate = status["bitrate"]?.numberValue { figures.append(Self.rate(bitrate)) }
            if !figures.isEmpty { head += " · " + figures.joined(separator: " · ") }
        }
        lines.append(head)
        if let memory = status["memory"], case .object = memory {
            var text = "memory:    "
            if let used = memory["private_dirty_bytes"]?.numberValue {
                text += Self.bytes(used)
                if let budget = memory["budget_bytes"]?.numberValue, budget > 0 {
                    text += " of a \(Self.bytes(budget)) budget"
                }
            }
            var more: [String] = []
            if let resident = memory["resident_bytes"]?.numberValue { more.append("resident \(Self.bytes(resident))") }
            if let replay = memory["replay_buffers_bytes"]?.numberValue, replay > 0 { more.append("replay \(Self.bytes(replay))") }
            if !more.isEmpty { text += "; " + more.joined(separator: ", ") }
            lines.append(text)
        }
        if let drift = status["audio_drift_ppm"]?.numberValue {
            lines.append("audio:     drift \(drift >= 0 ? "+" : "")\(Int(drift.rounded())) ppm against the video clock")
        }
        if case .object(let offsets)? = status["offsets_ms"], offsets.contains(where: { ($0.1.numberValue ?? 0) != 0 }) {
            // Only when a source is moved: "offsets:   video 0 ms, mic +120 ms".
            let parts = offsets.map { name, value -> String in
                let ms = value.numberValue ?? 0
                let text = ms == ms.rounded() ? String(Int(ms)) : String(ms)
                return "\(name) \(ms > 0 ? "+" : "")\(text) ms"
            }
            lines.append("offsets:   " + parts.joined(separator: ", "))
        }
        if case .object(let types)? = status["types"], !types.isEmpty {
            lines.append("sources:")
            let nameWidth = types.map(\.0.count).max() ?? 0
            for (type, fields) in types {
                var text = "  " + Self.padded(type, nameWidth) + "  " + Self.padded(fields["source_state"]?.stringValue ?? "?", 11)
                text += "  \(Self.count(fields["delivered"]?.numberValue)) delivered"
                var dropped: [String] = []
                if case .object(let reasons)? = fields["dropped"] {
                    for (reason, n) in reasons { if let n = n.numberValue, n > 0 { dropped.append("\(Self.count(n)) \(String(reason.map { $0 == "_" ? " " : $0 }))") } }
                }
                text += dropped.isEmpty ? ", none dropped" : ", dropped " + dropped.joined(separator: ", ")
                if let losses = fields["device_losses"]?.numberValue, losses > 0 { text += ", device lost \(Self.count(losses))×" }
                lines.append(text)
            }
        }
        if case .array(let outputs)? = status["outputs"], !outputs.isEmpty {
            lines.append("outputs:")
            let nameWidth = outputs.compactMap { $0["name"]?.stringValue?.count }.max() ?? 0
            let indent = String(repeating: " ", count: 2 + min(nameWidth, 20) + 2)
            for output in outputs {
                let name = output["name"]?.stringValue ?? "?"
                let kind = output["kind"]?.stringValue ?? "?"
                let paused = output["paused"] == .bool(true)
                let outputState = paused ? "paused" : output["state"]?.stringValue ?? "?"
                var text = "  " + Self.padded(Self.shortened(name, 20), min(nameWidth, 20)) + "  " + Self.padded(kind, 9) + " " + Self.padded(outputState, 12)
                var figures: [String] = []
                if kind == "replay" {
                    let buffered = output["buffered_seconds"]?.numberValue ?? 0
                    let wanted = output["replay_seconds"]?.numberValue
                    figures.append("buffered \(Self.decimal(buffered, 1))" + (wanted.map { " of \(Self.decimal($0, 0))" } ?? "") + " s")
                    let done = Int(output["saves_done"]?.numberValue ?? 0)
                    let failed = Int(output["saves_failed"]?.numberValue ?? 0)
                    figures.append("\(done) saved" + (failed > 0 ? ", \(failed) failed" : ""))
                } else {
                    figures.append(Self.rate(output["bitrate"]?.numberValue ?? 0))
                    if let bytes = output["bytes"]?.numberValue { figures.append(Self.bytes(bytes)) }
                }
                if let backlog = output["backlog_ms"]?.numberValue, backlog > 0 { figures.append("backlog \(Int(backlog)) ms") }
                var drops = 0.0
                if case .object(let reasons)? = output["drops"] { drops = reasons.compactMap { $0.1.numberValue }.reduce(0, +) }
                if drops > 0 { figures.append("\(Self.count(drops)) dropped") }
                if let reconnects = output["reconnects"]?.numberValue, reconnects > 0 { figures.append("\(Self.count(reconnects)) reconnects") }
                text += " " + figures.joined(separator: ", ")
                lines.append(text)
                if let target = output["target"]?.stringValue {
                    lines.append(indent + Self.shortened(target, width - indent.count))
                }
                if let saved = output["last_saved_path"]?.stringValue {
                    lines.append(Self.fitted(indent + "last saved " + saved, width, middle: true))
                }
                if let error = output["error"]?.stringValue {
                    lines.append(Self.fitted(indent + "error: " + error, width, middle: true))
                }
            }
        }
        if let error = status["error"]?.stringValue {
            lines.append(Self.fitted("error: " + error, width, middle: true))
        }
        if !events.isEmpty {
            lines.append("events:")
            for event in events { lines.append("  " + event) }
        }
        // Every line cut to the width at its end (those above that say most at both ends were cut
        // in the middle already).
        return lines.map { Self.fitted($0, width) }.joined(separator: "\n") + "\n"
    }

    // MARK: Units people read

    /// 2945 kbit/s, 12.3 Mbit/s.
    static func rate(_ bitsPerSecond: Double) -> String {
        bitsPerSecond >= 10_000_000 ? "\(decimal(bitsPerSecond / 1_000_000, 1)) Mbit/s" : "\(Int((bitsPerSecond / 1000).rounded())) kbit/s"
    }

    /// 512 B, 17.7 MiB, 1.20 GiB.
    static func bytes(_ n: Double) -> String {
        if n < 1024 { return "\(Int(n)) B" }
        if n < 1024 * 1024 { return "\(decimal(n / 1024, 1)) KiB" }
        if n < 1024 * 1024 * 1024 { return "\(decimal(n / 1024 / 1024, 1)) MiB" }
        return "\(decimal(n / 1024 / 1024 / 1024, 2)) GiB"
    }

    /// 8.3 s, 4:05, 1:02:03.
    static func clock(_ seconds: Double) -> String {
        guard seconds.isFinite, seconds >= 0 else { return "?" }
        if seconds < 60 { return "\(decimal(seconds, 1)) s" }
        let whole = Int(seconds)
        let (h, m, s) = (whole / 3600, whole / 60 % 60, whole % 60)
        let two = { (n: Int) in n < 10 ? "0\(n)" : "\(n)" }
        return h > 0 ? "\(h):\(two(m)):\(two(s))" : "\(m):\(two(s))"
    }

    static func count(_ n: Double?) -> String { n.map { "\(Int($0))" } ?? "?" }

    /// A fixed number of decimals, without Foundation's formatters.
    static func decimal(_ x: Double, _ places: Int) -> String {
        guard x.isFinite else { return "?" }
        var scale = 1.0
        for _ in 0..<places { scale *= 10 }
        let scaled = Int((abs(x) * scale).rounded())
        let sign = x < 0 && scaled > 0 ? "-" : ""
        guard places > 0 else { return sign + "\(scaled)" }
        let unit = Int(scale)
        var fraction = "\(scaled % unit)"
        while fraction.count < places { fraction = "0" + fraction }
        return sign + "\(scaled / unit).\(fraction)"
    }

    static func padded(_ text: String, _ width: Int) -> String {
        text.count >= width ? text : text + String(repeating: " ", count: width - text.count)
    }

    /// `text` in at most `width` characters: the middle replaced by "…" (a path's directory and
    /// a URL's host stay readable at both ends).
    static func shortened(_ text: String, _ width: Int) -> String {
        guard text.count > width, width >= 5 else { return text.count > width ? String(text.prefix(width)) : text }
        let keep = width - 1
        return String(text.prefix(keep - keep / 2)) + "…" + String(text.suffix(keep / 2))
    }

    /// A line cut to `width`: at the end with "…", or in the middle.
    static func fitted(_ line: String, _ width: Int, middle: Bool = false) -> String {
        guard line.count > width else { return line }
        if middle { return shortened(line, width) }
        return String(line.prefix(width - 1)) + "…"
    }

    /// One line for an event of `GET /v1/events` (its type and data), as the watch view lists them.
    public static func describe(_ type: String, _ data: JSONValue) -> String {
        let time = data["time"]?.stringValue.map { Self.timeOfDay($0) + "  " } ?? ""
        let text: String
        switch type {
        case "state": text = "connected: broadcast \(data["status"]?["state"]?.stringValue ?? "?")"
        case "broadcast": text = "broadcast \(data["state"]?.stringValue ?? "?")"
        case "output": text = "\(data["name"]?.stringValue ?? "?") \(data["state"]?.stringValue ?? "?")"
        case "device": text = "\(data["type"]?.stringValue ?? "?") device \(data["state"]?.stringValue ?? "?")"
        case "file": text = "\(data["output"]?.stringValue ?? "?") finished \(data["path"]?.stringValue ?? "a file")"
        case "drops":
            let who = data["output"]?.stringValue ?? data["type"]?.stringValue ?? "?"
            text = "\(who): \(count(data["dropped"]?.numberValue)) dropped"
        case "reload":
            let result = data["result"]?.stringValue ?? "?"
            text = "config reload (\(data["trigger"]?.stringValue ?? "?")): \(result)"
                + (result == "refused" ? ": \(data["message"]?.stringValue ?? "")" : "")
        default: text = type
        }
        return time + text
    }

    /// "2026-11-26T18:27:25.123Z" → "18:27:25"; anything else as it is.
    static func timeOfDay(_ iso: String) -> String {
        guard let t = iso.firstIndex(of: "T") else { return iso }
        return String(iso[iso.index(after: t)...].prefix(8))
    }
}
