import BroadcastKit
import BroadcastOutputs
import BroadcastService
import Synchronization

/// The markers taken during one broadcast, in order (the status and the events read them).
final class MarkerLog: Sendable {
    private let taken = Mutex<[TakenMark]>([])

    var all: [TakenMark] { taken.withLock { $0 } }

    /// Takes the next marker in `outputs` (numbered after those taken); throws as `Output.mark` does.
    func take(_ outputs: [Output], title: String?) throws(BroadcastError) -> TakenMark {
        let result: Result<TakenMark, BroadcastError> = taken.withLock { list in
            do throws(BroadcastError) {
                let mark = try Output.mark(outputs, title: title, number: list.count + 1)
                list.append(mark)
                return .success(mark)
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }
}

extension BroadcastController {
    /// Takes a marker in the running broadcast's recordings (`POST /v1/marker`, `broadcast mark`).
    func mark(title: String?) throws(BroadcastError) -> TakenMark {
        guard let (outputs, log) = runningMarkers() else {
            throw BroadcastError(.illegalTransition, "cannot take a marker: no broadcast is running")
        }
        let mark = try log.take(outputs, title: title)
        publishChanges()
        return mark
    }

    /// A marker as the status and the events show it.
    static func markerFields(_ mark: TakenMark) -> [(String, JSONValue)] {
        [
            ("number", .number(Double(mark.number))), ("title", .string(mark.title)),
            ("media_seconds", .number(Double(mark.media) / 1e9)), ("outputs", .array(mark.outputs.map(JSONValue.string))),
        ]
    }
}

enum MarkerAPI {
    /// POST /v1/marker: the title from the JSON body (`{"title": "..."}`) or `?title=`; none: "Marker N".
    static func mark(request: ControlRequest, controller: BroadcastController) -> ControlResponse {
        var title = request.query["title"]
        if !request.body.isEmpty {
            guard let document = JSONValue.parse(String(decoding: request.body, as: UTF8.self)), case .object = document else {
                return .error(400, "the body is not a JSON object: send {\"title\": \"...\"} (or nothing, or ?title=...)")
            }
            switch document["title"] {
            case nil, .null?: break
            case .string(let text)?: title = text
            default: return .error(400, "title must be a string")
            }
        }
        do {
            let mark = try controller.mark(title: title)
            return .json(200, .object(BroadcastController.markerFields(mark)))
        } catch {
            return .error(error.code == .illegalTransition ? 409 : 400, error.message)
        }
    }
}
