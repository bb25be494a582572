public import BroadcastKit

/// What an X11 screen source captures, as written after `--video x11:`.
///
/// ```
/// x11:DISPLAY[+X,Y][/WxH][?OPTION,OPTION...]
///   x11::0                         the whole screen of display :0
///   x11::99+100,200/1280x720       a 1280x720 region whose top left corner is at 100,200
///   x11::0?window=0x1a00007        one window, by id (hex or decimal), followed as it moves
///   x11::0?title=Firefox           one window, by title (exact, or else the first that contains it)
/// options: cursor=on|off (draw the pointer in; on), window-gone=end|keep (when the captured window
///          closes: end the broadcast with an error, or keep repeating its last frame; end),
///          shm=on|off (MIT-SHM shared memory; on). title= takes the rest of the text, commas included.
/// ```
/// An empty DISPLAY (`x11:`) means `$DISPLAY`.
public struct X11CaptureSpec: Sendable, Hashable, CustomStringConvertible {
    public enum Target: Sendable, Hashable {
        case screen
        case region(X11Rectangle)
        case window(UInt32)
        case windowTitled(String)
    }

    /// What happens when the captured window goes away.
    public enum WindowGone: String, Sendable, Hashable {
        /// The source fails: the session finishes with an error naming the window.
        case end
        /// The source keeps delivering the window's last frame (with a warning).
        case keep
    }

    /// Display name as XCB takes it (":0", ":99.0"); empty for $DISPLAY.
    public var display: String
    public var target: Target
    public var drawsCursor: Bool
    public var windowGone: WindowGone
    public var usesSharedMemory: Bool

    public init(
        display: String,
        target: Target = .screen,
        drawsCursor: Bool = true,
        windowGone: WindowGone = .end,
        usesSharedMemory: Bool = true
    ) {
        self.display = display
        self.target = target
        self.drawsCursor = drawsCursor
        self.windowGone = windowGone
        self.usesSharedMemory = usesSharedMemory
    }

    static let syntax = "expected x11:DISPLAY[+X,Y][/WxH][?window=ID|title=TEXT,cursor=on|off,window-gone=end|keep,shm=on|off], e.g. x11::0 or x11::99+100,200/1280x720"

    /// Parses the text of `--video` ("x11::0+10,20/640x480?cursor=off"). Errors are `.invalidArgument`
    /// and name the text and what is accepted.
    public init(parsing text: String) throws(BroadcastError) {
        func invalid(_ why: String) -> BroadcastError {
            BroadcastError(.invalidArgument, "invalid --video '\(text)': \(why); \(Self.syntax)")
        }
        guard text.hasPrefix("x11:") else { throw invalid("not an x11: source") }
        var rest = Substring(text.dropFirst(4))
        var optionsText: Substring?
        if let question = rest.firstIndex(of: "?") {
            optionsText = rest[rest.index(after: question)...]
            rest = rest[..<question]
        }
        // The display runs to the first '+' or '/' after its last ':' (host names may not hold either).
        let searchFrom = rest.lastIndex(of: ":") ?? rest.startIndex
        let geometryStart = rest[searchFrom...].firstIndex { $0 == "+" || $0 == "/" } ?? rest.endIndex
        let display = String(rest[..<geometryStart])
        if !display.isEmpty {
            guard let colon = display.lastIndex(of: ":"),
                display[display.index(after: colon)...].split(separator: ".", omittingEmptySubsequences: false)
                    .allSatisfy({ !$0.isEmpty && $0.allSatisfy(\.isNumber) }),
                display[display.index(after: colon)...].split(separator: ".").count <= 2
            else { throw invalid("'\(display)' is not an X display name such as :0 or :99.0") }
        }
        var geometry = rest[geometryStart...]
        var target = Target.screen
        if !geometry.isEmpty {
            var x = 0
            var y = 0
            var size: (Int, Int)?
            if geometry.hasPrefix("+") {
                let end = geometry.firstIndex(of: "/") ?? geometry.endIndex
                let position = geometry[geometry.index(after: geometry.startIndex)..<end].split(
                    separator: ",", omittingEmptySubsequences: false)
                guard position.count == 2, let px = Int(position[0]), let py = Int(position[1]),
                    (0...32767).contains(px), (0...32767).contains(py)
                else {
                    throw invalid("the region's position must be +X,Y with X and Y from 0 to 32767")
                }
                (x, y) = (px, py)
                geometry = geometry[end...]
            }
            if geometry.hasPrefix("/") {
                let dims = geometry.dropFirst().lowercased().split(separator: "x", omittingEmptySubsequences: false)
                guard dims.count == 2, let w = Int(dims[0]), let h = Int(dims[1]), (2...16384).contains(w),
                    (2...16384).contains(h)
                else { throw invalid("the region's size must be /WIDTHxHEIGHT, from 2 to 16384 each") }
                size = (w, h)
            } else if !geometry.isEmpty {
                throw invalid("unexpected '\(geometry)'")
            }
            // A region without a size runs to the screen's edges: width/height 0 until the screen is known.
            target = .region(X11Rectangle(x: x, y: y, width: size?.0 ?? 0, height: size?.1 ?? 0))
        }
        var spec = X11CaptureSpec(display: display, target: target)
        if var options = optionsText {
            while !options.isEmpty {
                let item: Substring
                if options.hasPrefix("title=") {
                    item = options
                    options = ""
                } else if let comma = options.firstIndex(of: ",") {
                    item = options[..<comma]
                    options = options[options.index(after: comma)...]
                } else {
                    item = options
                    options = ""
                }
                guard let eq = item.firstIndex(of: "=") else { throw invalid("option '\(item)' has no value") }
                let key = item[..<eq]
                let value = String(item[item.index(after: eq)...])
                switch key {
                case "window", "title":
                    guard case .screen = spec.target else { throw invalid("a window cannot be combined with a region") }
                    if key == "title" {
                        guard !value.isEmpty else { throw invalid("title= needs the window's title") }
                        spec.target = .windowTitled(value)
                    } else {
                        let id = value.lowercased().hasPrefix("0x") ? UInt32(value.dropFirst(2), radix: 16) : UInt32(value)
                        guard let id, id != 0 else { throw invalid("window= needs a window id such as 0x1a00007") }
                        spec.target = .window(id)
                    }
                case "cursor", "shm":
                    guard value == "on" || value == "off" else { throw invalid("\(key)= takes on or off") }
                    if key == "cursor" { spec.drawsCursor = value == "on" } else { spec.usesSharedMemory = value == "on" }
                case "window-gone":
                    guard let mode = WindowGone(rawValue: value) else { throw invalid("window-gone= takes end or keep") }
                    spec.windowGone = mode
                default:
                    throw invalid("unknown option '\(key)'")
                }
            }
        }
        self = spec
    }

    /// The display as messages show it.
    public var displayDescription: String { display.isEmpty ? "$DISPLAY" : display }

    public var description: String {
        switch target {
        case .screen: "X11 display \(displayDescription)"
        case .region(let r): "X11 display \(displayDescription) region \(r)"
        case .window(let id): "X11 display \(displayDescription) window \(X11CaptureSpec.hex(id))"
        case .windowTitled(let title): "X11 display \(displayDescription) window titled \"\(title)\""
        }
    }

    static func hex(_ id: UInt32) -> String { "0x" + String(id, radix: 16) }
}
