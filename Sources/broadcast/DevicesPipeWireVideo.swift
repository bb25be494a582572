import BroadcastCapture
import BroadcastService

/// The Wayland/PipeWire video part of `broadcast devices`: PipeWire video nodes and whether a
/// ScreenCast portal answers on the session bus (and its version and cursor modes).
struct PipeWireVideoListing {
    var nodes: [PipeWireNodes.Node]?
    var portalVersion: UInt32?
    var cursorModes: [ScreenCastPortal.CursorMode]?

    static func discover() -> PipeWireVideoListing {
        var listing = PipeWireVideoListing(nodes: PipeWireNodes.video())
        if let portal = try? ScreenCastPortal() {
            listing.portalVersion = portal.version()
            if listing.portalVersion != nil { listing.cursorModes = portal.availableCursorModes() }
            portal.close()
        }
        return listing
    }

    var text: String {
        var out = "PipeWire video nodes (--video pipewire:NAME or SERIAL):\n"
        if let nodes {
            if nodes.isEmpty { out += "  (none)\n" }
            for node in nodes {
                let description = node.description.isEmpty ? "" : "  \(node.description)"
                out += "  \(node.name)  (serial \(node.serial), \(node.mediaClass))\(description)\n"
            }
        } else {
            out += "  (PipeWire not reachable)\n"
        }
        out += "ScreenCast portal (--video portal, portal:window):\n"
        if let version = portalVersion {
            let modes = cursorModes.map { ", cursor modes: " + $0.map(\.name).joined(separator: ", ") } ?? ""
            out += "  answers, version \(version)\(modes)\n"
        } else {
            out += "  (none answers on the session bus)\n"
        }
        return out
    }

    var json: [(String, JSONValue)] {
        let nodesJSON: JSONValue = nodes.map { list in
            .array(list.map { node in
                .object([
                    ("name", .string(node.name)), ("serial", .number(Double(node.serial))), ("id", .number(Double(node.id))),
                    ("mediaClass", .string(node.mediaClass)), ("description", .string(node.description)),
                ])
            })
        } ?? .null
        var portal: [(String, JSONValue)] = [("available", .bool(portalVersion != nil))]
        if let version = portalVersion { portal.append(("version", .number(Double(version)))) }
        if let modes = cursorModes { portal.append(("cursorModes", .array(modes.map { .string($0.name) }))) }
        return [("pipewireVideo", nodesJSON), ("screencastPortal", .object(portal))]
    }
}
