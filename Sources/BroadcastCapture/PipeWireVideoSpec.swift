public import BroadcastKit

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// What a PipeWire video source captures, as written after `--video`.
///
/// ```
/// portal[:monitor|:window][?cursor=embedded|metadata|hidden]
///                     the Wayland desktop through the xdg-desktop-portal ScreenCast API
/// pipewire:NODE       any PipeWire video node, by node.name or object.serial (a camera, a virtual source)
/// ```
public struct PipeWireVideoSpec: Sendable, Hashable, CustomStringConvertible {
    public enum Target: Sendable, Hashable {
        case portal(ScreenCastPortal.SourceKind)
        case node(String)
    }

    public var target: Target
    public var cursor: ScreenCastPortal.CursorMode

    public init(target: Target, cursor: ScreenCastPortal.CursorMode = .embedded) {
        self.target = target
        self.cursor = cursor
    }

    static let syntax = "expected portal, portal:window or portal:monitor (optionally ?cursor=embedded|metadata|hidden) or pipewire:NODE (a node name or serial)"

    /// True when `text` is meant for this source (`portal...` or `pipewire:...`).
    public static func matches(_ text: String) -> Bool {
        text == "portal" || text.hasPrefix("portal:") || text.hasPrefix("portal?") || text.hasPrefix("pipewire:")
    }

    public init(parsing text: String) throws(BroadcastError) {
        func invalid(_ why: String) -> BroadcastError {
            BroadcastError(.invalidArgument, "invalid --video '\(text)': \(why); \(Self.syntax)")
        }
        if text.hasPrefix("pipewire:") {
            let node = String(text.dropFirst("pipewire:".count))
            guard !node.isEmpty, !node.contains(where: { $0.isWhitespace || $0 == "?" }) else {
                throw invalid("the node name or serial is missing or has spaces")
            }
            self.init(target: .node(node), cursor: .embedded)
            return
        }
        var head = Substring(text)
        var options: Substring = ""
        if let q = text.firstIndex(of: "?") {
            head = text[..<q]
            options = text[text.index(after: q)...]
        }
        let kind: ScreenCastPortal.SourceKind
        switch head {
        case "portal", "portal:monitor", "portal:screen": kind = .monitor
        case "portal:window": kind = .window
        default: throw invalid("unknown portal source '\(head)'")
        }
        var cursor = ScreenCastPortal.CursorMode.embedded
        for option in options.split(separator: ",", omittingEmptySubsequences: true) {
            let parts = option.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2, parts[0] == "cursor" else { throw invalid("unknown option '\(option)'") }
            guard let mode = ScreenCastPortal.CursorMode.allCases.first(where: { $0.name == parts[1] }) else {
                throw invalid("cursor must be embedded, metadata or hidden, not '\(parts[1])'")
            }
            cursor = mode
        }
        self.init(target: .portal(kind), cursor: cursor)
    }

    public var description: String {
        switch target {
        case .portal(let kind): "the ScreenCast portal's \(kind == .window ? "window" : "monitor")"
        case .node(let node): "PipeWire node \(node)"
        }
    }
}

/// Where the portal's restore token is kept between runs: one file per source kind in
/// `$STATE_DIRECTORY` (systemd's `StateDirectory=`), else `$XDG_STATE_HOME/broadcast`, else
/// `~/.local/state/broadcast`. A token is valid once: the new one from each Start replaces it.
public struct PortalTokenStore: Sendable {
    public var directory: String

    public init(directory: String? = nil) {
        if let directory {
            self.directory = directory
        } else if let state = Self.env("STATE_DIRECTORY") {
            self.directory = String(state.split(separator: ":").first ?? Substring(state))
        } else if let xdg = Self.env("XDG_STATE_HOME") {
            self.directory = xdg + "/broadcast"
        } else {
            self.directory = (Self.env("HOME") ?? "/tmp") + "/.local/state/broadcast"
        }
    }

    private static func env(_ name: String) -> String? {
        guard let value = getenv(name).map({ String(cString: $0) }), !value.isEmpty else { return nil }
        return value
    }

    public func path(for kind: ScreenCastPortal.SourceKind) -> String {
        directory + "/portal-" + (kind == .window ? "window" : "monitor") + ".token"
    }

    public func load(_ kind: ScreenCastPortal.SourceKind) -> String? {
        guard let file = fopen(path(for: kind), "re") else { return nil }
        defer { fclose(file) }
        var buffer = [CChar](repeating: 0, count: 512)
        guard fgets(&buffer, Int32(buffer.count), file) != nil else { return nil }
        let token = String(cString: buffer).trimmed()
        return token.isEmpty ? nil : token
    }

    /// Writes the token through a temporary file and a rename (never a half-written token).
    public func save(_ token: String, for kind: ScreenCastPortal.SourceKind) throws(BroadcastError) {
        var partial = ""
        for component in directory.split(separator: "/") {
            partial += "/" + component
            if mkdir(partial, 0o700) != 0 && errno != EEXIST {
                throw BroadcastError(.sourceFailed, "cannot create \(partial) for the portal's restore token: \(String(cString: strerror(errno)))")
            }
        }
        let target = path(for: kind)
        let temporary = target + ".\(getpid()).tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw BroadcastError(.sourceFailed, "cannot write \(temporary): \(String(cString: strerror(errno)))")
        }
        let text = token + "\n"
        let written = text.withCString { write(fd, $0, strlen($0)) }
        close(fd)
        guard written == text.utf8.count, rename(temporary, target) == 0 else {
            unlink(temporary)
            throw BroadcastError(.sourceFailed, "cannot write \(target): \(String(cString: strerror(errno)))")
        }
    }
}
