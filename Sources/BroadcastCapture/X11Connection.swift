import BroadcastKit
internal import CXCB

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A rectangle in root-window (screen) coordinates.
public struct X11Rectangle: Sendable, Hashable, CustomStringConvertible {
    public var x: Int
    public var y: Int
    public var width: Int
    public var height: Int

    public init(x: Int, y: Int, width: Int, height: Int) {
        self.x = x
        self.y = y
        self.width = width
        self.height = height
    }

    public var description: String { "\(width)x\(height)+\(x),\(y)" }

    func intersects(_ other: X11Rectangle) -> Bool {
        x < other.x + other.width && other.x < x + width && y < other.y + other.height && other.y < y + height
    }

    func intersection(_ other: X11Rectangle) -> X11Rectangle? {
        let x0 = max(x, other.x)
        let y0 = max(y, other.y)
        let x1 = min(x + width, other.x + other.width)
        let y1 = min(y + height, other.y + other.height)
        guard x1 > x0, y1 > y0 else { return nil }
        return X11Rectangle(x: x0, y: y0, width: x1 - x0, height: y1 - y0)
    }
}

/// One X screen as `broadcast devices` lists it.
public struct X11ScreenInfo: Sendable, Hashable, CustomStringConvertible {
    /// The display name to pass to `--video x11:DISPLAY` (":0", ":99.1").
    public var display: String
    public var width: Int
    public var height: Int
    public var depth: Int

    public init(display: String, width: Int, height: Int, depth: Int) {
        self.display = display
        self.width = width
        self.height = height
        self.depth = depth
    }

    public var description: String { "x11:\(display)  \(width)x\(height) depth \(depth)" }
}

/// One connection to an X server, owned by one thread at a time (XCB's connection is thread-safe,
/// but the replies and events it hands out are plain C memory that we free where we take them).
///
/// It is made on the thread that starts the source (so errors are thrown to the caller) and then
/// moved to the capture thread, which alone uses it from there on.
final class X11Connection: @unchecked Sendable {
    let connection: OpaquePointer
    let displayName: String
    let screenNumber: Int
    let root: UInt32
    let screenWidth: Int
    let screenHeight: Int
    let rootDepth: Int

    /// Connects to `display` (nil or empty: $DISPLAY).
    init(display: String?) throws(BroadcastError) {
        let name = display.flatMap { $0.isEmpty ? nil : $0 }
        let shown = name ?? (getenv("DISPLAY").map { String(cString: $0) } ?? "")
        guard !shown.isEmpty else {
            throw BroadcastError(.sourceFailed, "no X display given and DISPLAY is not set (use --video x11::0)")
        }
        var screen: Int32 = 0
        let connection: OpaquePointer? = name.map { xcb_connect($0, &screen) } ?? xcb_connect(nil, &screen)
        guard let connection, xcb_connection_has_error(connection) == 0 else {
            if let connection { xcb_disconnect(connection) }
            throw BroadcastError(.sourceFailed, "cannot open X display \(shown): no X server answers there")
        }
        let setup = xcb_get_setup(connection)
        var iterator = xcb_setup_roots_iterator(setup)
        guard screen >= 0, screen < iterator.rem else {
            xcb_disconnect(connection)
            throw BroadcastError(.sourceFailed, "X display \(shown) has no screen \(screen)")
        }
        for _ in 0..<screen { xcb_screen_next(&iterator) }
        let s = iterator.data.pointee
        self.connection = connection
        self.displayName = shown
        self.screenNumber = Int(screen)
        self.root = s.root
        self.screenWidth = Int(s.width_in_pixels)
        self.screenHeight = Int(s.height_in_pixels)
        self.rootDepth = Int(s.root_depth)
    }

    deinit { xcb_disconnect(connection) }

    var hasError: Bool { xcb_connection_has_error(connection) != 0 }

    var screenRectangle: X11Rectangle { X11Rectangle(x: 0, y: 0, width: screenWidth, height: screenHeight) }

    /// True when the root visual stores pixels as 32-bit little-endian 0x00RRGGBB: B G R X in memory,
    /// which is `.bgr0`. (Depth 24 and 32 on every current server; depth 16 or 8 are not supported.)
    func rootIsBGR0() -> Bool {
        let setup = xcb_get_setup(connection)
        let formats = xcb_setup_pixmap_formats(setup)
        let formatCount = Int(xcb_setup_pixmap_formats_length(setup))
        guard let formats,
            (0..<formatCount).contains(where: {
                Int(formats[$0].depth) == rootDepth && formats[$0].bits_per_pixel == 32
            })
        else { return false }
        var roots = xcb_setup_roots_iterator(setup)
        for _ in 0..<screenNumber { xcb_screen_next(&roots) }
        let visualID = roots.data.pointee.root_visual
        var depths = xcb_screen_allowed_depths_iterator(roots.data)
        while depths.rem > 0 {
            var visuals = xcb_depth_visuals_iterator(depths.data)
            while visuals.rem > 0 {
                let v = visuals.data.pointee
                if v.visual_id == visualID {
                    return v.red_mask == 0xff0000 && v.green_mask == 0xff00 && v.blue_mask == 0xff
                }
                xcb_visualtype_next(&visuals)
            }
            xcb_depth_next(&depths)
        }
        return false
    }

    /// Whether the server has extension `name`, and the code of its first event.
    func queryExtension(_ name: String) -> (present: Bool, firstEvent: UInt8) {
        let cookie = xcb_query_extension(connection, UInt16(name.utf8.count), name)
        guard let reply = xcb_query_extension_reply(connection, cookie, nil) else { return (false, 0) }
        defer { free(reply) }
        return (reply.pointee.present != 0, reply.pointee.first_event)
    }

    // MARK: Windows

    struct WindowGeometry {
        /// Where the window's inside is on the screen, and its size.
        var rectangle: X11Rectangle
    }

    /// The window's position on the screen and size; nil when the window is gone.
    func geometry(of window: UInt32) -> WindowGeometry? {
        let geometryCookie = xcb_get_geometry(connection, window)
        let translateCookie = xcb_translate_coordinates(connection, window, root, 0, 0)
        let geometry = xcb_get_geometry_reply(connection, geometryCookie, nil)
        let translated = xcb_translate_coordinates_reply(connection, translateCookie, nil)
        defer {
            free(geometry)
            free(translated)
        }
        guard let geometry, let translated else { return nil }
        return WindowGeometry(
            rectangle: X11Rectangle(
                x: Int(translated.pointee.dst_x),
                y: Int(translated.pointee.dst_y),
                width: Int(geometry.pointee.width),
                height: Int(geometry.pointee.height)
            )
        )
    }

    /// Asks for DestroyNotify and ConfigureNotify of `window`.
    func watchStructure(of window: UInt32) {
        var mask = XCB_EVENT_MASK_STRUCTURE_NOTIFY.rawValue
        xcb_change_window_attributes(connection, window, XCB_CW_EVENT_MASK.rawValue, &mask)
        xcb_flush(connection)
    }

    /// The window's title: _NET_WM_NAME (UTF-8) or else WM_NAME; nil when it has none.
    func title(of window: UInt32) -> String? {
        if let netName = atom("_NET_WM_NAME"), let utf8 = atom("UTF8_STRING"),
            let text = stringProperty(window, netName, type: utf8)
        {
            return text
        }
        return stringProperty(window, XCB_ATOM_WM_NAME.rawValue, type: XCB_ATOM_STRING.rawValue)
    }

    private var atoms: [String: UInt32] = [:]

    private func atom(_ name: String) -> UInt32? {
        if let known = atoms[name] { return known }
        let cookie = xcb_intern_atom(connection, 1, UInt16(name.utf8.count), name)
        guard let reply = xcb_intern_atom_reply(connection, cookie, nil) else { return nil }
        defer { free(reply) }
        guard reply.pointee.atom != 0 else { return nil }
        atoms[name] = reply.pointee.atom
        return reply.pointee.atom
    }

    private func stringProperty(_ window: UInt32, _ property: UInt32, type: UInt32) -> String? {
        let cookie = xcb_get_property(connection, 0, window, property, type, 0, 1024)
        guard let reply = xcb_get_property_reply(connection, cookie, nil) else { return nil }
        defer { free(reply) }
        let length = Int(xcb_get_property_value_length(reply))
        guard length > 0, let value = xcb_get_property_value(reply) else { return nil }
        return String(decoding: UnsafeRawBufferPointer(start: value, count: length), as: UTF8.self)
    }

    /// Every window below the root, breadth first (top-level windows first), bottom to top within a level.
    func allWindows() -> [UInt32] {
        var result: [UInt32] = []
        var queue: [UInt32] = [root]
        while !queue.isEmpty {
            let parent = queue.removeFirst()
            guard let reply = xcb_query_tree_reply(connection, xcb_query_tree(connection, parent), nil) else { continue }
            let count = Int(xcb_query_tree_children_length(reply))
            if let children = xcb_query_tree_children(reply) {
                for i in 0..<count {
                    result.append(children[i])
                    queue.append(children[i])
                }
            }
            free(reply)
        }
        return result
    }

    /// The mapped window whose title is `title`, or else the first whose title contains it
    /// (topmost wins among equals).
    func findWindow(titled title: String) -> UInt32? {
        var contains: UInt32?
        for window in allWindows().reversed() {
            guard let name = self.title(of: window) else { continue }
            if name == title { return window }
            if contains == nil, name.contains(title) { contains = window }
        }
        return contains
    }
}

extension X11ScreenSource {
    /// The screens of the X displays this process can reach: `$DISPLAY` and every local server
    /// with a socket in /tmp/.X11-unix. For `broadcast devices`.
    public static func reachableScreens() -> [X11ScreenInfo] {
        var displays: [String] = []
        if let env = getenv("DISPLAY").map({ String(cString: $0) }), !env.isEmpty { displays.append(env) }
        if let directory = opendir("/tmp/.X11-unix") {
            var numbers: [Int] = []
            while let entry = readdir(directory) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
                }
                if name.hasPrefix("X"), let n = Int(name.dropFirst()) { numbers.append(n) }
            }
            closedir(directory)
            for n in numbers.sorted() where !displays.contains(":\(n)") && !displays.contains(":\(n).0") {
                displays.append(":\(n)")
            }
        }
        var screens: [X11ScreenInfo] = []
        for display in displays {
            screens.append(contentsOf: self.screens(of: display))
        }
        return screens
    }

    /// Every screen of `display` (":0" lists ":0.0", ":0.1", ...); empty when it cannot be opened.
    public static func screens(of display: String) -> [X11ScreenInfo] {
        guard let connection = try? X11Connection(display: display) else { return [] }
        let base: Substring
        if let colon = display.lastIndex(of: ":"), let dot = display[colon...].firstIndex(of: ".") {
            base = display[..<dot]
        } else {
            base = Substring(display)
        }
        var result: [X11ScreenInfo] = []
        var iterator = xcb_setup_roots_iterator(xcb_get_setup(connection.connection))
        var index = 0
        while iterator.rem > 0 {
            let s = iterator.data.pointee
            let name = iterator.rem == 1 && index == 0 ? String(base) : "\(base).\(index)"
            result.append(
                X11ScreenInfo(
                    display: name, width: Int(s.width_in_pixels), height: Int(s.height_in_pixels), depth: Int(s.root_depth))
            )
            xcb_screen_next(&iterator)
            index += 1
        }
        return result
    }
}
