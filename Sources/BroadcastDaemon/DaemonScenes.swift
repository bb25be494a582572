import BroadcastKit
import BroadcastMedia
import BroadcastService

/// `POST /v1/scene/{name}` (`broadcast scene NAME`): the composite shows that scene from its next
/// frame; the sources of every scene keep capturing, so nothing waits for a device.
enum DaemonScenes {
    static func select(_ name: String, controller: BroadcastController) -> ControlResponse {
        guard !name.isEmpty, !name.contains("/") else { return .error(404, "use /v1/scene/{name}") }
        guard let composite = controller.runningComposite() else {
            return .error(409, "cannot switch to scene \(name): no broadcast with scenes is running (see [scenes] in the config)")
        }
        do {
            try composite.select(scene: name)
        } catch {
            return .error(404, error.message)
        }
        return .json(200, .object([("scene", .string(name)), ("applies", .string("at the next frame"))]))
    }
}
